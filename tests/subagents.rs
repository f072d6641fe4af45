//! The subagent seam over the real runtime, JSONL store and agent loop with the scripted model:
//! provider registry, capability checks before dispatch, depth, the fork seed boundary,
//! lifecycle events, structured output and cancellation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use kin::testkit::agent::{TurnEnd, completed_prefix};
use kin::testkit::config::{Config, Overrides};
use kin::testkit::model::script::{ReplayEntry, ScriptedModel};
use kin::testkit::model::{Model, ModelRoute, text_response, tool_call_response};
use kin::testkit::runtime::Runtime;
use kin::testkit::session::{Event, SessionHeader};
use kin::testkit::subagent::{
    Capabilities, ErrorCode, Lifecycle, ResolvedStart, StartRequest, StopReason, SubagentError, SubagentProvider,
    SubagentRun, child_depth,
};
use kin::testkit::tools::{Caller, ToolRegistry};
use serde_json::{Value, json};

#[allow(dead_code)]
mod common;
use common::{Quiet, runtime, start_request, until};

fn chunks(c: Vec<kin::testkit::model::StreamChunk>) -> ReplayEntry {
    ReplayEntry::Chunks(c)
}

fn caller(depth: u64) -> Arc<Caller> {
    let mut header = SessionHeader::new("parent-1", 1, Some("/w".into()));
    header.delegation_depth = depth;
    Arc::new(Caller { header, depth, route: ModelRoute::parse("p/m").unwrap(), history: None })
}

fn request(parent: Arc<Caller>) -> StartRequest {
    StartRequest { max_depth: None, ..start_request(&parent, "hi") }
}

/// A provider without capabilities that records whether `start` ran.
struct Bare {
    name: String,
    started: Arc<AtomicBool>,
}

impl SubagentProvider for Bare {
    fn name(&self) -> &str {
        &self.name
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }
    fn inherits_parent_context(&self) -> bool {
        false
    }
    fn start(&self, _: ResolvedStart) -> BoxFuture<'static, Result<SubagentRun, SubagentError>> {
        self.started.store(true, Ordering::SeqCst);
        async { Err(SubagentError::new(ErrorCode::Infrastructure, "bare provider cannot start")) }.boxed()
    }
}

#[tokio::test]
async fn providers_are_unique_and_lookups_name_the_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![], "");
    let service = rt.subagents();
    assert_eq!(service.list(), ["spawn", "fork"]);
    let started = Arc::new(AtomicBool::new(false));
    let dup = service.register_provider(Arc::new(Bare { name: "spawn".into(), started: started.clone() })).unwrap_err();
    assert_eq!(
        (dup.code.code(), dup.message.as_str()),
        ("DUPLICATE_PROVIDER", "a subagent provider named \"spawn\" is already registered")
    );
    let missing = service.start("nope", request(caller(0))).await.err().unwrap();
    assert_eq!(
        (missing.code.code(), missing.message.as_str()),
        ("NO_PROVIDER", "no subagent provider registered for \"nope\"")
    );
}

#[tokio::test]
async fn unsupported_capabilities_are_rejected_before_dispatch() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![], "");
    let started = Arc::new(AtomicBool::new(false));
    rt.subagents().register_provider(Arc::new(Bare { name: "bare".into(), started: started.clone() })).unwrap();
    type Setter = Box<dyn Fn(&mut StartRequest)>;
    let cases: Vec<(&str, Setter)> = vec![
        ("outputSchema", Box::new(|r| r.output_schema = Some(json!({"type": "object"})))),
        ("depthLimit", Box::new(|r| r.max_depth = Some(3))),
        ("toolFilter", Box::new(|r| r.tool_filter = Some(Default::default()))),
        ("persona", Box::new(|r| r.persona = Some("p".into()))),
    ];
    for (cap, set) in cases {
        let mut req = request(caller(0));
        set(&mut req);
        let err = rt.subagents().start("bare", req).await.err().unwrap();
        assert_eq!(err.code, ErrorCode::UnsupportedCapability);
        assert_eq!(err.message, format!("subagent provider \"bare\" does not support the \"{cap}\" capability"));
    }
    assert!(!started.load(Ordering::SeqCst), "no capability failure reached the provider");
}

#[test]
fn depth_is_parent_plus_one_and_capped() {
    assert_eq!(child_depth(0, Some(3)).unwrap(), 1);
    assert_eq!(child_depth(2, None).unwrap(), 3);
    let err = child_depth(2, Some(2)).unwrap_err();
    assert_eq!((err.code, err.message.as_str()), (ErrorCode::Depth, "subagent depth 3 exceeds maxDepth 2"));
    assert_eq!(child_depth((1 << 53) - 1, None).unwrap_err().code, ErrorCode::InvalidRequest);
    assert_eq!(
        child_depth(0, Some(u64::MAX)).unwrap_err().message,
        "subagent maxDepth must be a non-negative safe integer"
    );
}

#[tokio::test]
async fn depth_rejection_creates_no_child_and_no_lifecycle() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![], "");
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    rt.subagents().observe(move |e| seen.lock().unwrap().push(e.clone()));
    let mut req = request(caller(1));
    req.max_depth = Some(1);
    let err = rt.subagents().start("spawn", req).await.err().unwrap();
    assert_eq!(err.message, "subagent depth 2 exceeds maxDepth 1");
    assert!(events.lock().unwrap().is_empty());
    assert!(rt.store().list().is_empty(), "no child session exists");
}

fn ev(seq: u64, kind: &str) -> Event {
    Event { kind: kind.into(), seq, time: 0, data: json!({}).into(), source_event_seqs: None, surface_op: None }
}

#[test]
fn the_fork_seed_ends_at_the_last_turn_end() {
    let events =
        vec![ev(0, "turn/start"), ev(1, "turn/end"), ev(2, "user/message"), ev(3, "turn/start"), ev(4, "tool/call")];
    assert_eq!(completed_prefix(&events).len(), 2);
    assert!(completed_prefix(&events[..1]).is_empty());
}

#[tokio::test]
async fn a_run_publishes_its_child_and_pairs_lifecycle_events() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![chunks(text_response(&["child says hi"]))], "");
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    rt.subagents().observe(move |e| seen.lock().unwrap().push(e.clone()));
    let mut req = request(caller(0));
    req.label = Some("greet".into());
    let run = rt.subagents().start("spawn", req).await.unwrap();
    let header = rt.store().inspect(&run.id).unwrap().header;
    assert_eq!(header.parent_session.as_deref(), Some("parent-1"));
    assert_eq!(
        (header.origin.as_deref(), header.delegation_depth, header.cwd.as_deref()),
        (Some("subagent"), 1, Some("/w"))
    );
    let result = run.result.await.unwrap().unwrap();
    assert_eq!((result.output.as_str(), result.stop_reason), ("child says hi", StopReason::Completed));
    (run.dispose)().await.unwrap();
    let log = rt.store().inspect(&run.id).unwrap().events;
    let kinds: Vec<&str> = log.iter().filter(|e| e.kind != "assistant/chunk").map(|e| e.kind.as_str()).collect();
    assert_eq!(&kinds[..5], ["turn/start", "user/message", "session/title", "subagent/descriptor", "step/start"]);
    assert_eq!(log[3].data, json!({"version": 2, "mode": "one-shot", "provider": "spawn", "label": "greet"}));
    assert!(log[3].surface_op.is_none(), "the descriptor is log-only");
    let events = events.lock().unwrap();
    assert!(matches!(&events[0], Lifecycle::Start { id, local: true, .. } if *id == run.id));
    assert!(matches!(
        &events[1],
        Lifecycle::End { id, stop_reason: Some(StopReason::Completed), output: Some(out), failure: None, .. }
            if *id == run.id && out == "child says hi"
    ));
}

#[tokio::test]
async fn a_child_without_its_structured_capture_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![chunks(text_response(&["no capture"]))], "");
    let mut req = request(caller(0));
    req.output_schema = Some(json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}));
    let run = rt.subagents().start("spawn", req).await.unwrap();
    assert_eq!(run.result.await.unwrap().unwrap().stop_reason, StopReason::Error);
    (run.dispose)().await.unwrap();
    let mut bad = request(caller(0));
    bad.output_schema = Some(json!({"type": "array"}));
    assert_eq!(rt.subagents().start("spawn", bad).await.err().unwrap().code, ErrorCode::InvalidRequest);
}

#[tokio::test]
async fn cancelling_the_parent_turn_cancels_the_child() {
    let dir = tempfile::tempdir().unwrap();
    let entries = vec![
        chunks(tool_call_response("c1", "subagent", r#"{"description":"slow","prompt":"take forever"}"#)),
        ReplayEntry::Hang { chunks: vec![], ready_file: None },
    ];
    let (rt, model) = runtime(dir.path(), entries, "");
    let cwd = dir.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let id = rt.new_session(&cwd, Arc::new(Quiet)).unwrap();
    let turn = rt.prompt(&id, vec![json!({"type": "text", "text": "go"})]).unwrap();
    // The child's (hanging) model call is made: its turn is running.
    let child_call = || model.requests().into_iter().map(|r| r.session_id).find(|s| *s != id);
    until("the child's model call", || child_call().is_some()).await;
    let child = child_call().unwrap();
    rt.cancel(&id);
    let end = tokio::time::timeout(Duration::from_secs(5), turn).await.unwrap().unwrap();
    assert_eq!(end, TurnEnd::Aborted);
    let child_log = rt.store().inspect(&child).unwrap().events;
    assert_eq!(child_log.last().unwrap().data["reason"]["kind"], "aborted", "the child's turn was cancelled");
    let parent_log = rt.store().inspect(&id).unwrap().events;
    let result = parent_log.iter().find(|e| e.kind == "tool/result").unwrap();
    let text: &Value = &result.data["message"]["content"][0]["content"][0]["text"];
    assert_eq!(text, "Error: subagent run was cancelled");
    rt.shutdown().await;
}

#[tokio::test]
async fn children_are_never_listed_as_top_level_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let entries = vec![
        chunks(tool_call_response("c1", "subagent", r#"{"description":"d","prompt":"p"}"#)),
        chunks(text_response(&["child"])),
        chunks(text_response(&["parent"])),
    ];
    let (rt, model) =
        runtime(dir.path(), entries, "[subagents]\npersona = \"You are terse.\"\ndeny_tools = [\"subagent_fork\"]\n");
    let cwd = dir.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let id = rt.new_session(&cwd, Arc::new(Quiet)).unwrap();
    assert_eq!(rt.prompt(&id, vec![json!({"type": "text", "text": "go"})]).unwrap().await.unwrap(), TurnEnd::Completed);
    let listed: Vec<String> = rt.list_sessions(None).unwrap().into_iter().map(|(s, _)| s.header.id).collect();
    assert_eq!(listed, [id]);
    assert_eq!(rt.store().list().len(), 2);
    // The child's request carried the persona and the filtered tool list.
    let child_request = &model.requests()[1];
    assert!(child_request.system.contains("You are terse."));
    let names: Vec<&str> = child_request.tools.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"subagent") && !names.contains(&"subagent_fork"), "{names:?}");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_child_inherits_its_parents_permission_mode() {
    let dir = tempfile::tempdir().unwrap();
    let entries = vec![
        chunks(tool_call_response("c1", "subagent", r#"{"description":"d","prompt":"run a command"}"#)),
        chunks(tool_call_response("b1", "bash", r#"{"command":"touch escaped","description":"try"}"#)),
        chunks(text_response(&["could not"])),
        chunks(text_response(&["parent done"])),
    ];
    let config_path = dir.path().join("config.toml");
    std::fs::write(&config_path, "permission_mode = \"read-only\"\n").unwrap();
    let overrides =
        Overrides { config: Some(config_path), sessions: Some(dir.path().join("sessions")), ..Default::default() };
    let config = Config::resolve(&overrides, &|_| None).unwrap();
    let mut tools = ToolRegistry::new();
    kin::testkit::tools::builtin::register_coding_tools(&mut tools, kin::testkit::tools::fs::FileState::new());
    let rt = Runtime::new(config, Arc::new(ScriptedModel::new(entries)) as Arc<dyn Model>, tools).unwrap();
    let cwd = dir.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let id = rt.new_session(&cwd, Arc::new(Quiet)).unwrap();
    assert_eq!(rt.prompt(&id, vec![json!({"type": "text", "text": "go"})]).unwrap().await.unwrap(), TurnEnd::Completed);
    assert!(!cwd.join("escaped").exists(), "the child's bash did not run");
    let child =
        rt.store().list().into_iter().find(|s| s.header.parent_session.as_deref() == Some(id.as_str())).unwrap();
    let events = rt.store().inspect(&child.header.id).unwrap().events;
    let result = events.iter().find(|e| e.kind == "tool/result").unwrap();
    assert_eq!(
        result.data["message"]["content"][0]["content"][0]["text"],
        "Error: bash is not allowed in read-only mode"
    );
    rt.shutdown().await;
}

/// A provider whose published run fails outside the child (an infrastructure fault) and whose
/// disposal fails too, as dsh's `subagent-published-run-failure` overlay does.
struct FailingRun;

impl SubagentProvider for FailingRun {
    fn name(&self) -> &str {
        "failing"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }
    fn inherits_parent_context(&self) -> bool {
        false
    }
    fn start(&self, _: ResolvedStart) -> BoxFuture<'static, Result<SubagentRun, SubagentError>> {
        let (tx, result) = tokio::sync::oneshot::channel();
        let _ = tx.send(Err(SubagentError::new(ErrorCode::Infrastructure, "published run failed")));
        let dispose: kin::testkit::subagent::Dispose =
            Box::new(|| async { Err("handle disposal failed".to_string()) }.boxed());
        async move { Ok(SubagentRun { id: "run-1".into(), local: false, cwd: None, result, dispose }) }.boxed()
    }
}

fn delegate(
    service: Arc<kin::testkit::subagent::SubagentService>,
    provider: &str,
) -> kin::testkit::subagent::tools::DelegateTool {
    let config = kin::testkit::subagent::tools::DelegateConfig {
        tool_name: "subagent".into(),
        provider: provider.into(),
        max_depth: Some(3),
        persona: None,
        tool_filter: None,
        route: None,
        output_schema: None,
        note: None,
        external: false,
    };
    kin::testkit::subagent::tools::DelegateTool::new(config, service, None).unwrap()
}

fn tool_context(caller: Arc<Caller>) -> kin::testkit::tools::ToolContext {
    kin::testkit::tools::ToolContext {
        session_id: caller.header.id.clone(),
        cwd: None,
        call_id: "c1".into(),
        cancel: tokio_util::sync::CancellationToken::new(),
        caller: Some(caller),
        allow_outside: false,
        allow_unsandboxed: false,
        file_access: None,
        progress: None,
    }
}

/// The `subagent` tool over a provider whose runs fail, and the lifecycle events it records.
fn failing_delegate() -> (kin::testkit::subagent::tools::DelegateTool, Arc<Mutex<Vec<Lifecycle>>>) {
    let service = Arc::new(kin::testkit::subagent::SubagentService::new());
    service.register_provider(Arc::new(FailingRun)).unwrap();
    let ends = Arc::new(Mutex::new(Vec::new()));
    let seen = ends.clone();
    service.observe(move |e| seen.lock().unwrap().push(e.clone()));
    (delegate(service, "failing"), ends)
}

#[tokio::test]
async fn a_failed_run_names_its_cause_and_the_failed_disposal() {
    use kin::testkit::tools::Tool;
    let (tool, ends) = failing_delegate();
    let args = json!({"description": "d", "prompt": "p"});
    let err = tool.execute(args, tool_context(caller(0))).await.err().unwrap();
    assert_eq!(err.message, "subagent run failed: published run failed; dispose failed: handle disposal failed");
    // The start/end pair is closed, and the end carries the infrastructure failure.
    let ends = ends.lock().unwrap();
    assert!(matches!(&ends[0], Lifecycle::Start { .. }), "{ends:?}");
    assert!(
        matches!(&ends[1], Lifecycle::End { stop_reason: None, output: None, failure: Some(f), .. } if f == "published run failed"),
        "{ends:?}"
    );
}

/// Arguments the model got wrong are refused before any child starts: a blank prompt, and a
/// `run_in_background` that is not a boolean (it was read as false: a foreground child ran
/// while the model thought it had started a background one).
#[tokio::test]
async fn a_blank_prompt_or_a_background_flag_that_is_not_a_boolean_starts_nothing() {
    use kin::testkit::tools::Tool;
    let (tool, ends) = failing_delegate();
    for (args, said) in [
        (json!({"description": "d", "prompt": " \n"}), "prompt is empty: give the subagent its whole task"),
        (
            json!({"description": "d", "prompt": "p", "run_in_background": "yes"}),
            "`run_in_background` must be true or false, got \"yes\"",
        ),
        (
            json!({"description": "d", "prompt": "p", "run_in_background": 1}),
            "`run_in_background` must be true or false, got 1",
        ),
    ] {
        let err = tool.execute(args, tool_context(caller(0))).await.err().unwrap();
        assert_eq!(err.code, "INVALID_ARGUMENTS", "{err:?}");
        assert!(err.message.contains(said), "{}", err.message);
    }
    // "true" as a string is what it says, and this tool offers no background children.
    let args = json!({"description": "d", "prompt": "p", "run_in_background": "true"});
    let err = tool.execute(args, tool_context(caller(0))).await.err().unwrap();
    assert_eq!(err.message, "run_in_background is not enabled for this tool");
    assert!(ends.lock().unwrap().is_empty(), "no child started: {:?}", ends.lock().unwrap());
}

#[tokio::test]
async fn a_child_whose_turn_fails_reports_the_childs_error_to_the_parent() {
    let dir = tempfile::tempdir().unwrap();
    let entries = vec![
        chunks(tool_call_response("c1", "subagent", r#"{"description":"d","prompt":"p"}"#)),
        ReplayEntry::Throw { chunks: vec![], message: "upstream went away".into(), code: "MODEL_FAILED".into() },
        chunks(text_response(&["parent carries on"])),
    ];
    let (rt, _) = runtime(dir.path(), entries, "");
    let ends = Arc::new(Mutex::new(Vec::new()));
    let seen = ends.clone();
    rt.subagents().observe(move |e| seen.lock().unwrap().push(e.clone()));
    let cwd = dir.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let id = rt.new_session(&cwd, Arc::new(Quiet)).unwrap();
    assert_eq!(rt.prompt(&id, vec![json!({"type": "text", "text": "go"})]).unwrap().await.unwrap(), TurnEnd::Completed);
    let events = rt.store().inspect(&id).unwrap().events;
    let result = events.iter().find(|e| e.kind == "tool/result").unwrap();
    assert_eq!(
        result.data["message"]["content"][0]["content"][0]["text"],
        "Error: subagent run failed: upstream went away"
    );
    let ends = ends.lock().unwrap().clone();
    assert!(
        matches!(&ends[1], Lifecycle::End { stop_reason: Some(StopReason::Error), failure: Some(f), .. } if f == "upstream went away"),
        "{ends:?}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn a_depth_rejection_inside_a_grandchild_reaches_the_parent_in_the_childs_words() {
    let dir = tempfile::tempdir().unwrap();
    let delegate = |id: &str| chunks(tool_call_response(id, "subagent", r#"{"description":"d","prompt":"go deeper"}"#));
    let entries = vec![
        delegate("p1"),
        delegate("c1"),
        delegate("g1"),
        chunks(text_response(&["grandchild: subagent depth 3 exceeds maxDepth 2"])),
        chunks(text_response(&["child: the grandchild could not go deeper"])),
        chunks(text_response(&["parent done"])),
    ];
    let (rt, _) = runtime(dir.path(), entries, "[subagents]\nmax_depth = 2\n");
    let cwd = dir.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let id = rt.new_session(&cwd, Arc::new(Quiet)).unwrap();
    assert_eq!(rt.prompt(&id, vec![json!({"type": "text", "text": "go"})]).unwrap().await.unwrap(), TurnEnd::Completed);
    let result_of = |session: &str| {
        let events = rt.store().inspect(session).unwrap().events;
        let result = events.iter().find(|e| e.kind == "tool/result").unwrap().clone();
        (
            result.data["message"]["content"][0]["content"][0]["text"].clone(),
            result.data["message"]["content"][0]["isError"].clone(),
        )
    };
    let child_of = |parent: &str| {
        rt.store().list().into_iter().find(|s| s.header.parent_session.as_deref() == Some(parent)).unwrap().header
    };
    let child = child_of(&id);
    let grandchild = child_of(&child.id);
    assert_eq!((child.delegation_depth, grandchild.delegation_depth), (1, 2));
    assert_eq!(result_of(&grandchild.id), (json!("Error: subagent depth 3 exceeds maxDepth 2"), json!(true)));
    assert_eq!(result_of(&child.id), (json!("grandchild: subagent depth 3 exceeds maxDepth 2"), json!(false)));
    assert_eq!(result_of(&id), (json!("child: the grandchild could not go deeper"), json!(false)));
    assert!(rt.store().list().iter().all(|s| s.header.delegation_depth <= 2), "no depth-3 session exists");
    rt.shutdown().await;
}

/// The runtime's child factory, except that every child agent it starts is already shut down
/// when `start_agent` returns: the first submission to it fails, after the child's log exists.
struct ClosingFactory(Arc<Runtime>);

impl kin::testkit::subagent::inprocess::ChildFactory for ClosingFactory {
    fn mint_id(&self) -> String {
        self.0.mint_id()
    }
    fn create_session(
        &self,
        header: SessionHeader,
        seed: Vec<Event>,
    ) -> Result<kin::testkit::session::Session, SubagentError> {
        self.0.create_session(header, seed)
    }
    fn load_session(
        &self,
        id: &str,
    ) -> Result<(kin::testkit::session::Session, kin::testkit::agent::Restored), String> {
        kin::testkit::subagent::inprocess::ChildFactory::load_session(&*self.0, id)
    }
    fn stored_header(&self, id: &str) -> Option<SessionHeader> {
        kin::testkit::subagent::inprocess::ChildFactory::stored_header(&*self.0, id)
    }
    fn stored_events(&self, id: &str) -> Result<Vec<Event>, String> {
        self.0.stored_events(id)
    }
    fn stored_subagents(&self) -> Vec<SessionHeader> {
        kin::testkit::subagent::inprocess::ChildFactory::stored_subagents(&*self.0)
    }
    fn start_agent(
        &self,
        session: kin::testkit::session::Session,
        restored: kin::testkit::agent::Restored,
        setup: kin::testkit::subagent::inprocess::ChildSetup,
    ) -> kin::testkit::agent::AgentHandle {
        let handle = self.0.start_agent(session, restored, setup);
        tokio::task::block_in_place(|| futures::executor::block_on(handle.shutdown()));
        handle
    }
    fn live_agent(&self, id: &str) -> Option<kin::testkit::agent::AgentHandle> {
        self.0.live_agent(id)
    }
    fn live_ancestors(&self, id: &str) -> Vec<String> {
        self.0.live_ancestors(id)
    }
    fn release(&self, id: &str) {
        self.0.release(id)
    }
    fn agent_now(&self, session_id: &str, name: &str) -> Option<kin::testkit::subagent::agents::Launch> {
        kin::testkit::subagent::inprocess::ChildFactory::agent_now(&*self.0, session_id, name)
    }
    fn roll_back<'a>(&'a self, id: &'a str, handle: Option<kin::testkit::agent::AgentHandle>) -> BoxFuture<'a, ()> {
        self.0.roll_back(id, handle)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_after_creating_the_child_leaves_nothing_behind() {
    use kin::testkit::subagent::continuation::{ContinuationManager, ContinuationSettings};
    use kin::testkit::subagent::inprocess::{ChildFactory, InProcessProvider};
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![], "");
    let factory: Arc<dyn ChildFactory> = Arc::new(ClosingFactory(rt.clone()));
    let service = Arc::new(kin::testkit::subagent::SubagentService::new());
    service.register_provider(Arc::new(InProcessProvider::spawn(Arc::downgrade(&factory)))).unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    service.observe(move |e| seen.lock().unwrap().push(e.clone()));
    let (_, parent) = common::parent(&rt, dir.path());
    let stored = || rt.store().list().into_iter().filter(|s| s.header.parent_session.is_some()).count();

    // One-shot: the provider's start rejects, and no child session or lifecycle pair remains.
    let err = service.start("spawn", start_request(&parent, "hi")).await.err().unwrap();
    assert_eq!(err.code, ErrorCode::Infrastructure, "{err:?}");
    assert_eq!(stored(), 0, "the one-shot child's log was removed");
    assert!(events.lock().unwrap().is_empty(), "a rejected start emits no lifecycle pair");

    // Continuable: the first prompt is never accepted; the log (descriptor and all) is removed,
    // and the subagent/start already emitted is closed by a subagent/end with the cause.
    let manager = Arc::new(ContinuationManager::new(
        service.clone(),
        Arc::downgrade(&factory),
        ContinuationSettings::default(),
        Arc::new(|_| Vec::new()),
    ));
    let err = manager.start("spawn", "bg".into(), start_request(&parent, "hi")).await.err().unwrap();
    assert_eq!(err.code, ErrorCode::ActivationClosing, "{err:?}");
    assert_eq!(stored(), 0, "the continuable child's log was removed");
    let events = events.lock().unwrap().clone();
    assert_eq!(events.len(), 2, "{events:?}");
    let (Lifecycle::Start { run_id: started, id, .. }, Lifecycle::End { run_id: ended, failure, stop_reason, .. }) =
        (&events[0], &events[1])
    else {
        panic!("not a start/end pair: {events:?}");
    };
    assert_eq!((started, stop_reason, failure.as_deref()), (ended, &None, Some(err.message.as_str())));
    assert!(!manager.is_resident(id));
    assert!(rt.child_tree(&parent.header.id, 8).unwrap().is_empty(), "the agent tree shows no child");
}
