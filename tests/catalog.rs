//! The durable subagent catalog (issue 7; seed 000, dsh-design.md §1.5, §1.6.4, §1.8): session
//! query, `list_children` and `list_agents`, over the real JSONL store, the real runtime with the
//! scripted model, and the real binary over pipes. Each test names the checklist item (§5) it
//! pins.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kin::testkit::agent::TurnEnd;
use kin::testkit::model::script::{ReplayEntry, ScriptedModel};
use kin::testkit::model::{ModelRoute, text_response, tool_call_response};
use kin::testkit::session::query::{
    EventRecord, Lineage, QueryError, QueryFault, QueryService, ReadRequest, SessionLog, SessionQuery, SessionRecord,
    SessionSource, StoreSource, Surface, Trace, Window, merge_records, sibling_order,
};
use kin::testkit::session::{Event, Kind, Session, SessionHeader, SessionStore};
use kin::testkit::subagent::catalog::{Activity, ListEntry, Mode, QUERY_UNAVAILABLE, Reason, list_children};
use kin::testkit::subagent::control::SendMessageTool;
use kin::testkit::subagent::descriptor::Descriptor;
use kin::testkit::subagent::inprocess::ChildFactory;
use kin::testkit::subagent::list_agents::{DESCRIPTION, ListAgentsTool, render};
use kin::testkit::subagent::{ErrorCode, SubagentError};
use kin::testkit::tools::{Caller, Tool, ToolContext, ToolRegistry};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[allow(dead_code)]
mod common;
use common::Peer;
use common::{parent, runtime_with, start_request, until};

const P: &str = "11111111-1111-4111-8111-111111111111";
const A: &str = "child-a";
const B: &str = "child-b";
const C: &str = "child-c";

// ---------------------------------------------------------------------------------------------
// Logs over the real store.

fn store() -> (tempfile::TempDir, SessionStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SessionStore::new(dir.path().join("sessions"));
    (dir, store)
}

fn header(id: &str, parent: Option<&str>, created_at: u64) -> SessionHeader {
    let mut h = SessionHeader::new(id, created_at, Some("/w".into()));
    if let Some(parent) = parent {
        h.parent_session = Some(parent.to_string());
        h.origin = Some("subagent".into());
        h.delegation_depth = 1;
    }
    h
}

fn continuable(label: &str) -> Descriptor {
    Descriptor::Continuable {
        provider: "spawn".into(),
        label: label.into(),
        agent_provider: Some("test".into()),
        agent_model: Some("m".into()),
        persona: None,
        tool_filter: None,
        agent: None,
    }
}

/// The event type of a descriptor.
const DESCRIPTOR_EVENT: &str = "subagent/descriptor";

fn descriptor_event(seq: u64, payload: Value) -> Event {
    Event {
        kind: DESCRIPTOR_EVENT.into(),
        seq,
        time: 0,
        data: payload.into(),
        source_event_seqs: None,
        surface_op: None,
    }
}

/// One completed turn: the prompt, one chunk, the answer.
fn turn(session: &mut Session, prompt: &str, answer: &str) {
    let n = session.next_turn();
    session.append("turn/start", json!({"turn": n, "trigger": {"kind": "message", "source": {"kind": "user"}}}));
    let message = json!({"role": "user", "content": [{"type": "text", "text": prompt}], "source": {"kind": "user"}, "id": format!("u{n}")});
    session.append_surface("user/message", message, None);
    let chunk = json!({"turn": n, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": answer}});
    let chunk = session.append("assistant/chunk", chunk);
    let answer =
        json!({"turn": n, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": answer}]}});
    session.append_surface("assistant/message", answer, Some(vec![chunk]));
    session.append("turn/end", json!({"turn": n, "reason": {"kind": "completed"}}));
}

fn parent_log(store: &SessionStore, id: &str, created_at: u64) {
    let mut session = store.create(header(id, None, created_at)).unwrap();
    turn(&mut session, "hi", "hello");
    session.flush().unwrap();
}

/// A child session with `seed` and one turn, not yet flushed.
fn child_session(store: &SessionStore, header: SessionHeader, seed: Vec<Event>) -> Session {
    let mut session = store.create_seeded(header, seed).unwrap();
    turn(&mut session, "work", "done");
    session
}

/// A settled continuable child as the continuation manager writes it: the descriptor seed,
/// `session/end-seed`, one turn.
fn continuable_child(store: &SessionStore, id: &str, parent: &str, created_at: u64, label: &str) {
    let seed = vec![descriptor_event(0, continuable(label).to_value())];
    child_session(store, header(id, Some(parent), created_at), seed).flush().unwrap();
}

/// A one-shot child as the in-process driver writes it: the descriptor inside the first turn.
fn one_shot_child(store: &SessionStore, id: &str, parent: &str, created_at: u64, label: Option<&str>) {
    let mut session = store.create(header(id, Some(parent), created_at)).unwrap();
    session.append("turn/start", json!({"turn": 1, "trigger": {"kind": "message", "source": {"kind": "user"}}}));
    let prompt =
        json!({"role": "user", "content": [{"type": "text", "text": "go"}], "source": {"kind": "user"}, "id": "u"});
    session.append_surface("user/message", prompt, None);
    let descriptor = Descriptor::OneShot { provider: "spawn".into(), label: label.map(str::to_string), agent: None };
    session.append(DESCRIPTOR_EVENT, descriptor.to_value());
    session.append("turn/end", json!({"turn": 1, "reason": {"kind": "completed"}}));
    session.flush().unwrap();
}

/// An ordinary fork of `parent` (its completed events as the seed, `seedLength`, no descriptor).
fn fork_child(store: &SessionStore, id: &str, parent: &str, created_at: u64) {
    let seed = store.inspect(parent).unwrap().events;
    let mut h = header(id, Some(parent), created_at);
    h.origin = None;
    h.seed_length = Some(seed.len() as u64);
    child_session(store, h, seed).flush().unwrap();
}

fn ev(seq: u64, kind: &str, data: Value) -> Value {
    json!({"type": kind, "seq": seq, "time": 0, "data": data})
}

fn surface_ev(seq: u64, kind: &str, data: Value, op: Value, sources: Option<Vec<u64>>) -> Value {
    let mut event = ev(seq, kind, data);
    event["surfaceOp"] = op;
    if let Some(sources) = sources {
        event["sourceEventSeqs"] = json!(sources);
    }
    event
}

/// Writes a log as JSONL text, exactly as given.
fn write_raw(store: &SessionStore, header: &SessionHeader, events: &[Value]) {
    let path = kin::testkit::session::layout::log_path(store.root(), header.cwd.as_deref(), &header.id);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut text = serde_json::to_string(header).unwrap();
    text.push('\n');
    for event in events {
        text.push_str(&event.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

fn log_path(store: &SessionStore, id: &str) -> PathBuf {
    store.locate(id).unwrap().unwrap()
}

/// Every file under `root` with its bytes and modification time.
fn snapshot(root: &Path) -> Vec<(PathBuf, Vec<u8>, SystemTime)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
                let bytes = std::fs::read(&path).unwrap();
                out.push((path, bytes, modified));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

// ---------------------------------------------------------------------------------------------
// The query and listings.

fn query(store: &SessionStore, live: &[&str]) -> SessionQuery {
    let live: HashSet<String> = live.iter().map(|s| s.to_string()).collect();
    SessionQuery::new(StoreSource::new(store.clone(), move |id: &str| live.contains(id)))
}

fn shared<Q: QueryService + 'static>(query: Q) -> Arc<dyn QueryService> {
    Arc::new(query)
}

fn list_with(
    query: &dyn QueryService,
    parent: &str,
    cancel: &CancellationToken,
) -> Result<Vec<ListEntry>, SubagentError> {
    list_children(Some(query), parent, cancel)
}

fn list(query: &dyn QueryService, parent: &str) -> Result<Vec<ListEntry>, SubagentError> {
    list_with(query, parent, &CancellationToken::new())
}

fn child(id: &str, mode: Mode, label: Option<&str>, activity: Activity) -> ListEntry {
    ListEntry::Child {
        id: id.into(),
        mode,
        label: label.map(str::to_string),
        agent: None,
        activity,
        inbox: Default::default(),
    }
}

fn cont(id: &str, label: &str, activity: Activity) -> ListEntry {
    child(id, Mode::Continuable, Some(label), activity)
}

fn diag(id: &str, reason: Reason) -> ListEntry {
    ListEntry::Diagnostic { id: id.into(), reason }
}

/// A parent with three settled continuable children A, B, C (in that order).
fn family() -> (tempfile::TempDir, SessionStore) {
    let (dir, store) = store();
    parent_log(&store, P, 0);
    for (i, id) in [A, B, C].into_iter().enumerate() {
        continuable_child(&store, id, P, i as u64 + 1, &format!("label {id}"));
    }
    (dir, store)
}

fn healthy(id: &str) -> ListEntry {
    cont(id, &format!("label {id}"), Activity::Inactive)
}

type Hook = Box<dyn Fn(&str, Option<&CancellationToken>) -> Option<QueryFault> + Send + Sync>;
type Edit = Box<dyn Fn(&mut Window) + Send + Sync>;

fn hook(f: impl Fn(&str, Option<&CancellationToken>) -> Option<QueryFault> + Send + Sync + 'static) -> Option<Hook> {
    Some(Box::new(f))
}

/// Wraps the real query: records every call and injects failures, cancellations and changed
/// read results at precise points (dsh's list-children tests wrap `sessionQuery` the same way).
struct Faulty {
    inner: SessionQuery,
    /// Called with the parent id and the trace's token.
    trace: Option<Hook>,
    /// Called with the child id before its events are listed (no token: `listEvents` takes none).
    seqs: Option<Hook>,
    /// Called with the child id and the exact read's token.
    read: Option<Hook>,
    /// Changes a successful read's result.
    edit: Option<Edit>,
    calls: Mutex<Vec<String>>,
}

impl Faulty {
    fn new(inner: SessionQuery) -> Self {
        Faulty { inner, trace: None, seqs: None, read: None, edit: None, calls: Mutex::default() }
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }
}

impl QueryService for Faulty {
    fn trace_session(&self, id: &str, cancel: &CancellationToken) -> Result<Trace, QueryFault> {
        self.record(format!("trace {id}"));
        if let Some(fault) = self.trace.as_ref().and_then(|h| h(id, Some(cancel))) {
            return Err(fault);
        }
        self.inner.trace_session(id, cancel).map_err(QueryFault::Query)
    }

    fn list_events(&self, id: &str) -> Result<Vec<EventRecord>, QueryFault> {
        self.record(format!("events {id}"));
        if let Some(fault) = self.seqs.as_ref().and_then(|h| h(id, None)) {
            return Err(fault);
        }
        self.inner.list_events(id).map_err(QueryFault::Query)
    }

    fn event_seqs(&self, id: &str, kind: &Kind) -> Result<Vec<u64>, QueryFault> {
        self.record(format!("events {id}"));
        if let Some(fault) = self.seqs.as_ref().and_then(|h| h(id, None)) {
            return Err(fault);
        }
        self.inner.event_seqs(id, kind).map_err(QueryFault::Query)
    }

    fn read_event(&self, request: &ReadRequest, cancel: &CancellationToken) -> Result<Window, QueryFault> {
        self.record(format!("read {}", request.session_id));
        if let Some(fault) = self.read.as_ref().and_then(|h| h(request.session_id.as_str(), Some(cancel))) {
            return Err(fault);
        }
        let mut window = self.inner.read_event(request, cancel).map_err(QueryFault::Query)?;
        if let Some(edit) = &self.edit {
            edit(&mut window);
        }
        Ok(window)
    }
}

fn query_fault(e: QueryError) -> Option<QueryFault> {
    Some(QueryFault::Query(e))
}

fn assert_cancelled(result: Result<Vec<ListEntry>, SubagentError>) {
    let err = result.unwrap_err();
    assert_eq!((err.code, err.message.as_str()), (ErrorCode::Cancelled, "subagent listing was cancelled"));
    assert_eq!(err.code.code(), "CANCELLED");
}

// ---------------------------------------------------------------------------------------------
// B. listChildren

#[test]
fn a_live_child_with_a_descriptor_lists_running_with_only_the_store_and_a_live_set() {
    // 12: no runtime, no agents, no continuation manager: sessions, the catalog and the query.
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    continuable_child(&store, A, P, 1, "live one");
    let q = query(&store, &[A]);
    assert_eq!(list(&q, P).unwrap(), [cont(A, "live one", Activity::Running)]);
}

#[test]
fn listing_without_session_query_fails_before_any_work() {
    // 13: even a cancelled token and an unknown parent: the missing query is reported first.
    let cancel = CancellationToken::new();
    cancel.cancel();
    let err = list_children(None, "no-such-parent", &cancel).unwrap_err();
    assert_eq!(err.code, ErrorCode::SessionQueryUnavailable);
    assert_eq!(err.code.code(), "SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE");
    assert_eq!(err.code.name(), "SubagentError");
    assert_eq!(err.message, "listing subagents requires session query (load a dsh-session-query backend)");
    assert_eq!(err.message, QUERY_UNAVAILABLE);
}

#[test]
fn a_persisted_settled_continuable_child_lists_inactive_with_its_label() {
    // 14
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    continuable_child(&store, A, P, 1, "summarize the doc");
    assert_eq!(list(&query(&store, &[]), P).unwrap(), [cont(A, "summarize the doc", Activity::Inactive)]);
}

#[test]
fn one_shot_and_continuable_children_list_from_one_trace() {
    // 15: an unlabeled one-shot child has no label.
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    one_shot_child(&store, A, P, 1, None);
    one_shot_child(&store, B, P, 2, Some("quick check"));
    continuable_child(&store, C, P, 3, "long task");
    let faulty = Faulty::new(query(&store, &[]));
    assert_eq!(
        list(&faulty, P).unwrap(),
        [
            child(A, Mode::OneShot, None, Activity::Inactive),
            child(B, Mode::OneShot, Some("quick check"), Activity::Inactive),
            cont(C, "long task", Activity::Inactive),
        ]
    );
    assert_eq!(faulty.calls().iter().filter(|c| c.starts_with("trace")).count(), 1, "one trace");
}

#[test]
fn a_parent_that_exists_only_in_persistence_can_be_listed() {
    // 16: the restart shape: nothing is live; the parent's own log even ends in an open turn.
    let (_dir, store) = store();
    let mut parent = store.create(header(P, None, 0)).unwrap();
    turn(&mut parent, "hi", "hello");
    parent.append("turn/start", json!({"turn": 2, "trigger": {"kind": "message", "source": {"kind": "user"}}}));
    parent.flush().unwrap();
    drop(parent);
    continuable_child(&store, A, P, 1, "a");
    let q = query(&store, &[]);
    let trace = q.trace_session(P, &CancellationToken::new()).unwrap();
    assert!(!trace.target.live && trace.target.persisted);
    assert_eq!(list(&q, P).unwrap(), [cont(A, "a", Activity::Inactive)]);
}

#[test]
fn siblings_are_ordered_by_created_at_then_id() {
    // 17: authored createdAt 5/5/9, written in reverse.
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    let ids = [
        "00000000-0000-4000-8000-000000000001",
        "00000000-0000-4000-8000-000000000002",
        "00000000-0000-4000-8000-000000000003",
    ];
    for (id, created_at) in [(ids[2], 9), (ids[1], 5), (ids[0], 5)] {
        continuable_child(&store, id, P, created_at, id);
    }
    let listed = list(&query(&store, &[]), P).unwrap();
    assert_eq!(listed.iter().map(ListEntry::id).collect::<Vec<_>>(), ids);
}

#[test]
fn id_ties_compare_case_insensitively_like_locale_compare() {
    // 17 (ties): dsh uses localeCompare; kin compares case-insensitively first, so "a-2" sorts
    // before "B-1" although byte order would put "B-1" first.
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    continuable_child(&store, "B-1", P, 5, "b");
    continuable_child(&store, "a-2", P, 5, "a");
    let listed = list(&query(&store, &[]), P).unwrap();
    assert_eq!(listed.iter().map(ListEntry::id).collect::<Vec<_>>(), ["a-2", "B-1"]);
}

#[test]
fn an_ordinary_fork_child_is_omitted_without_a_diagnostic() {
    // 18
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    fork_child(&store, A, P, 1);
    continuable_child(&store, B, P, 2, "label child-b");
    assert_eq!(list(&query(&store, &[]), P).unwrap(), [healthy(B)]);
}

#[test]
fn a_live_child_is_running_while_a_settled_sibling_is_inactive() {
    // 19 (and 69: live → running, persisted only → inactive)
    let (_dir, store) = family();
    let listed = list(&query(&store, &[B]), P).unwrap();
    assert_eq!(listed, [healthy(A), cont(B, "label child-b", Activity::Running), healthy(C)]);
}

#[test]
fn two_descriptors_in_the_own_suffix_are_corrupt_without_another_read() {
    // 20
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    continuable_child(&store, A, P, 1, "label child-a");
    let mut twice =
        child_session(&store, header(B, Some(P), 2), vec![descriptor_event(0, continuable("b").to_value())]);
    twice.append(DESCRIPTOR_EVENT, continuable("b again").to_value());
    twice.flush().unwrap();
    continuable_child(&store, C, P, 3, "label child-c");
    let faulty = Faulty::new(query(&store, &[]));
    assert_eq!(list(&faulty, P).unwrap(), [healthy(A), diag(B, Reason::Corrupt), healthy(C)]);
    assert!(!faulty.calls().contains(&format!("read {B}")), "{:?}", faulty.calls());
}

#[test]
fn an_invalid_event_surface_is_corrupt() {
    // 21: a user message without surfaceOp.
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    let prompt =
        json!({"role": "user", "content": [{"type": "text", "text": "no op"}], "source": {"kind": "user"}, "id": "u"});
    let events = [
        ev(0, DESCRIPTOR_EVENT, continuable("a").to_value()),
        ev(1, "session/end-seed", json!({})),
        ev(2, "turn/start", json!({"turn": 1, "trigger": {"kind": "message", "source": {"kind": "user"}}})),
        ev(3, "user/message", prompt),
        ev(4, "turn/end", json!({"turn": 1, "reason": {"kind": "completed"}})),
    ];
    write_raw(&store, &header(A, Some(P), 1), &events);
    continuable_child(&store, B, P, 2, "label child-b");
    let q = query(&store, &[]);
    assert_eq!(list(&q, P).unwrap(), [diag(A, Reason::Corrupt), healthy(B)]);
    assert_eq!(q.list_events(A).unwrap_err().code(), "SESSION_QUERY_INVALID_SURFACE");
}

#[test]
fn a_malformed_descriptor_payload_is_corrupt() {
    // 22
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    let bad = json!({"version": 2, "mode": "continuable", "provider": 7, "label": "x"});
    child_session(&store, header(A, Some(P), 1), vec![descriptor_event(0, bad)]).flush().unwrap();
    continuable_child(&store, B, P, 2, "label child-b");
    assert_eq!(list(&query(&store, &[]), P).unwrap(), [diag(A, Reason::Corrupt), healthy(B)]);
}

#[test]
fn descriptor_version_three_is_unsupported() {
    // 23
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    let future = json!({"version": 3, "mode": "continuable", "provider": "spawn", "label": "x"});
    child_session(&store, header(A, Some(P), 1), vec![descriptor_event(0, future)]).flush().unwrap();
    continuable_child(&store, B, P, 2, "label child-b");
    assert_eq!(list(&query(&store, &[]), P).unwrap(), [diag(A, Reason::Unsupported), healthy(B)]);
}

#[test]
fn a_fork_seed_holding_an_ancestor_descriptor_does_not_make_a_subagent() {
    // 24: A is itself a subagent; a fork of A inherits A's descriptor inside its seed only.
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    continuable_child(&store, A, P, 1, "the parent subagent");
    let seed = store.inspect(A).unwrap().events;
    let mut fork = header("fork-of-a", Some(A), 2);
    fork.seed_length = Some(seed.len() as u64);
    child_session(&store, fork, seed.clone()).flush().unwrap();
    // A forked continuable child: the lineage seed, then its own descriptor.
    let mut sub = header("sub-of-a", Some(A), 3);
    sub.seed_length = Some(seed.len() as u64);
    let mut own = seed.clone();
    own.push(descriptor_event(seed.len() as u64, continuable("forked subagent").to_value()));
    child_session(&store, sub, own).flush().unwrap();
    assert_eq!(list(&query(&store, &[]), A).unwrap(), [cont("sub-of-a", "forked subagent", Activity::Inactive)]);
}

#[test]
fn a_child_whose_provider_is_not_registered_still_lists() {
    // 25: listing consults no provider registry.
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    let mut descriptor = continuable("orphaned provider").to_value();
    descriptor["provider"] = json!("no-such-provider");
    child_session(&store, header(A, Some(P), 1), vec![descriptor_event(0, descriptor)]).flush().unwrap();
    assert_eq!(list(&query(&store, &[]), P).unwrap(), [cont(A, "orphaned provider", Activity::Inactive)]);
}

#[test]
fn a_candidate_listing_failure_after_the_trace_is_one_unavailable_diagnostic() {
    // 26
    let (_dir, store) = family();
    let faulty = Faulty {
        seqs: hook(|id, _| (id == B).then(|| QueryFault::Query(QueryError::PersistenceFailed("disk gone".into())))),
        ..Faulty::new(query(&store, &[]))
    };
    assert_eq!(list(&faulty, P).unwrap(), [healthy(A), diag(B, Reason::Unavailable), healthy(C)]);
}

#[test]
fn session_and_event_not_found_during_candidate_reads_are_unavailable() {
    // 27
    let (_dir, store) = family();
    let faulty = Faulty {
        seqs: hook(|id, _| (id == B).then(|| QueryFault::Query(QueryError::SessionNotFound(B.into())))),
        read: hook(|id, _| {
            (id == C).then(|| QueryFault::Query(QueryError::EventNotFound { session_id: C.into(), seq: 0 }))
        }),
        ..Faulty::new(query(&store, &[]))
    };
    assert_eq!(list(&faulty, P).unwrap(), [healthy(A), diag(B, Reason::Unavailable), diag(C, Reason::Unavailable)]);
}

#[test]
fn a_known_child_whose_log_or_header_can_no_longer_be_read_is_unavailable_not_gone() {
    // Issue 17: once a child is known, a log kin cannot stat as a regular file or a header line
    // it cannot read is an `unavailable` candidate, in list_children and in the agent tree.
    let (dir, store) = family();
    parent_log(&store, "other-parent", 9);
    one_shot_child(&store, "child-d", P, 4, None);
    let q = query(&store, &[]);
    let all = [healthy(A), healthy(B), healthy(C), child("child-d", Mode::OneShot, None, Activity::Inactive)];
    assert_eq!(list(&q, P).unwrap(), all);
    // A: its header line is overwritten (the file changes, so its header is read again).
    let a = log_path(&store, A);
    let text = std::fs::read_to_string(&a).unwrap();
    let rest = &text[text.find('\n').unwrap()..];
    std::fs::write(&a, format!("{{\"not\": \"a header\"}}{rest}")).unwrap();
    // B: a directory in place of its log.
    let b = log_path(&store, B);
    std::fs::remove_file(&b).unwrap();
    std::fs::create_dir(&b).unwrap();
    // C: a dangling symlink in place of its log.
    let c = log_path(&store, C);
    std::fs::remove_file(&c).unwrap();
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &c).unwrap();
    // D: its session directory is a symlink to a file, so the log's stat fails (ENOTDIR).
    let d = log_path(&store, "child-d");
    let d_dir = d.parent().unwrap().to_path_buf();
    std::fs::remove_dir_all(&d_dir).unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    std::os::unix::fs::symlink(&file, &d_dir).unwrap();
    let expected = [A, B, C, "child-d"].map(|id| diag(id, Reason::Unavailable));
    assert_eq!(list(&q, P).unwrap(), expected);
    let tree = kin::testkit::subagent::catalog::list_tree(Some(&q), P, 8, &CancellationToken::new()).unwrap();
    assert_eq!(tree.into_iter().map(|t| t.entry).collect::<Vec<_>>(), expected, "the agent tree agrees");
    assert_eq!(list(&q, P).unwrap(), expected, "and stays so at the next scan");
    // Restored, each child lists as before.
    std::fs::write(&a, &text).unwrap();
    assert_eq!(list(&q, P).unwrap()[0], healthy(A));
}

#[test]
fn a_child_log_deleted_after_the_trace_is_unavailable() {
    // 27 (real): the log vanishes between the trace and the candidate's read.
    let (_dir, store) = family();
    let path = log_path(&store, B);
    let faulty = Faulty {
        seqs: hook(move |id, _| {
            if id == B {
                let _ = std::fs::remove_file(&path);
            }
            None
        }),
        ..Faulty::new(query(&store, &[]))
    };
    assert_eq!(list(&faulty, P).unwrap(), [healthy(A), diag(B, Reason::Unavailable), healthy(C)]);
    // Deleted before the trace, the child is simply no longer a candidate.
    assert_eq!(list(&query(&store, &[]), P).unwrap(), [healthy(A), healthy(C)]);
}

#[test]
fn an_exact_read_naming_another_parent_is_corrupt() {
    // 28
    let (_dir, store) = family();
    let faulty = Faulty {
        edit: Some(Box::new(|w: &mut Window| {
            if w.session.id == B {
                std::sync::Arc::make_mut(&mut w.session).parent_session = Some("someone-else".into());
            }
        })),
        ..Faulty::new(query(&store, &[]))
    };
    assert_eq!(list(&faulty, P).unwrap(), [healthy(A), diag(B, Reason::Corrupt), healthy(C)]);
}

#[test]
fn an_exact_read_whose_header_changed_is_corrupt() {
    // 28 (header re-check): the read's header differs from the traced one.
    let (_dir, store) = family();
    let faulty = Faulty {
        edit: Some(Box::new(|w: &mut Window| {
            if w.session.id == A {
                std::sync::Arc::make_mut(&mut w.session).created_at += 1;
            }
        })),
        ..Faulty::new(query(&store, &[]))
    };
    assert_eq!(list(&faulty, P).unwrap(), [diag(A, Reason::Corrupt), healthy(B), healthy(C)]);
}

#[test]
fn an_exact_read_whose_target_is_no_longer_the_descriptor_is_corrupt() {
    // 29
    let (_dir, store) = family();
    let faulty = Faulty {
        edit: Some(Box::new(|w: &mut Window| {
            if w.session.id == C {
                w.target.kind = "turn/start".into();
            }
        })),
        ..Faulty::new(query(&store, &[]))
    };
    assert_eq!(list(&faulty, P).unwrap(), [healthy(A), healthy(B), diag(C, Reason::Corrupt)]);
}

#[test]
fn a_trace_failure_fails_the_whole_call_with_its_own_code() {
    // 30
    let (_dir, store) = family();
    let faulty = Faulty {
        trace: hook(|_, _| query_fault(QueryError::PersistenceFailed("cannot list the store".into()))),
        ..Faulty::new(query(&store, &[]))
    };
    let err = list(&faulty, P).unwrap_err();
    assert_eq!(err.code, ErrorCode::Query("SESSION_QUERY_PERSISTENCE_FAILED"));
    assert_eq!(err.code.code(), "SESSION_QUERY_PERSISTENCE_FAILED");
    assert_eq!(err.code.name(), "SessionQueryError");
    assert_eq!(err.message, "cannot list the store");
    assert_eq!(faulty.calls(), [format!("trace {P}")], "no candidate was read");
}

#[test]
fn an_unreadable_store_fails_the_trace_with_persistence_failed() {
    // 30 (real): the sessions root is not a directory.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, "x").unwrap();
    let q = SessionQuery::new(StoreSource::persisted_only(SessionStore::new(file)));
    assert_eq!(list(&q, P).unwrap_err().code.code(), "SESSION_QUERY_PERSISTENCE_FAILED");
}

#[test]
fn an_unknown_parent_fails_the_listing_with_session_not_found() {
    // 30 (the target itself is missing from the corpus)
    let (_dir, store) = family();
    assert_eq!(list(&query(&store, &[]), "nobody").unwrap_err().code.code(), "SESSION_QUERY_SESSION_NOT_FOUND");
}

#[test]
fn an_unrecognised_candidate_failure_propagates() {
    // 31: a failure that is not a query error fails the call (kin: an infrastructure error with
    // the original message).
    let (_dir, store) = family();
    let faulty = Faulty {
        seqs: hook(|id, _| (id == B).then(|| QueryFault::Other("the backend exploded".into()))),
        ..Faulty::new(query(&store, &[]))
    };
    let err = list(&faulty, P).unwrap_err();
    assert_eq!((err.code, err.message.as_str()), (ErrorCode::Infrastructure, "the backend exploded"));
}

#[test]
fn a_window_failure_propagates_instead_of_becoming_a_diagnostic() {
    // 32
    let (_dir, store) = family();
    let faulty = Faulty {
        read: hook(|id, _| (id == A).then(|| QueryFault::Query(QueryError::InvalidWindow("bad window".into())))),
        ..Faulty::new(query(&store, &[]))
    };
    let err = list(&faulty, P).unwrap_err();
    assert_eq!(err.code.code(), "SESSION_QUERY_INVALID_WINDOW");
}

/// A settled continuable child's events; `compacted` adds a compaction that replaces the first
/// exchange with a summary.
fn conversation(label: &str, compacted: bool) -> Vec<Value> {
    let user = |text: &str| json!({"role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}, "id": text});
    let assistant =
        json!({"turn": 1, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": "done"}]}});
    let append = || json!("append");
    let mut events = vec![
        ev(0, DESCRIPTOR_EVENT, continuable(label).to_value()),
        ev(1, "session/end-seed", json!({})),
        ev(2, "turn/start", json!({"turn": 1, "trigger": {"kind": "message", "source": {"kind": "user"}}})),
        surface_ev(3, "user/message", user("work"), append(), None),
        ev(
            4,
            "assistant/chunk",
            json!({"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "done"}}),
        ),
        surface_ev(5, "assistant/message", assistant, append(), Some(vec![4])),
        ev(6, "turn/end", json!({"turn": 1, "reason": {"kind": "completed"}})),
    ];
    if compacted {
        events.push(ev(7, "compact/start", json!({})));
        // The checkpoint replaces the nodes from seq 3 through seq 5 and names them as sources.
        events.push(surface_ev(
            8,
            "user/message",
            user("summary"),
            json!({"op": "replace", "start": 3, "end": 5}),
            Some(vec![7, 3, 5]),
        ));
        events.push(ev(9, "compact/end", json!({})));
    }
    events
}

#[test]
fn compacted_and_uncompacted_twins_list_identically() {
    // 33
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    write_raw(&store, &header(A, Some(P), 1), &conversation("twin", true));
    write_raw(&store, &header(B, Some(P), 2), &conversation("twin", false));
    let q = query(&store, &[]);
    assert_eq!(list(&q, P).unwrap(), [cont(A, "twin", Activity::Inactive), cont(B, "twin", Activity::Inactive)]);
    let surfaces: Vec<Surface> = q.list_events(A).unwrap().into_iter().map(|r| r.surface).collect();
    use Surface::{Current, LogOnly, Shadowed};
    assert_eq!(surfaces, [LogOnly, LogOnly, LogOnly, Shadowed, LogOnly, Shadowed, LogOnly, LogOnly, Current, LogOnly]);
}

#[tokio::test]
async fn a_child_compacted_for_real_lists_like_its_uncompacted_twin() {
    // 33, with a real compaction: twin continuable children, one compacted by its agent.
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    for (id, at) in [(A, 1), (B, 2)] {
        let seed = vec![descriptor_event(0, continuable("twin").to_value())];
        let mut session = store.create_seeded(header(id, Some(P), at), seed).unwrap();
        turn(&mut session, &"x".repeat(2000), "done");
        turn(&mut session, "more", "done");
        session.flush().unwrap();
    }
    let before = list(&query(&store, &[]), P).unwrap();
    assert_eq!(before, [cont(A, "twin", Activity::Inactive), cont(B, "twin", Activity::Inactive)]);
    let model = Arc::new(ScriptedModel::new([ReplayEntry::Chunks(text_response(&["Summary of the work."]))]));
    let deps = kin::testkit::agent::AgentDeps {
        model: model.clone(),
        tools: ToolRegistry::new(),
        route: ModelRoute::parse("test/model").unwrap(),
        system: String::new(),
        max_steps: 5,
        max_parallel_tools: 1,
        depth: 1,
        permissions: None,
        prompt: None,
        file_access: None,
        retry: Default::default(),
        compaction: Default::default(),
    };
    let handle = kin::testkit::agent::spawn_agent(store.load(A).unwrap(), deps);
    let outcome = handle.compact(None).await.unwrap();
    assert!(matches!(outcome, kin::testkit::agent::compact::Manual::Compacted(_)), "{outcome:?}");
    handle.shutdown().await;
    let events = store.inspect(A).unwrap().events;
    let replaced = events.iter().find(|e| e.surface_op.as_ref().is_some_and(|op| op["op"] == "replace"));
    assert!(replaced.is_some() && events.iter().any(|e| e.kind == "compact/summary"), "A was compacted");
    assert_eq!(store.load(A).unwrap().messages().len(), 2, "the checkpoint and the newest answer");
    let q = query(&store, &[]);
    let after = list(&q, P).unwrap();
    assert_eq!(after, before, "compaction changes no listing");
    assert_eq!(render(&after[..1]), render(&after[1..]).replace(B, A), "list_agents shows the twins alike");
}

#[test]
fn grandchildren_are_not_candidates() {
    // 34
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    continuable_child(&store, A, P, 1, "label child-a");
    continuable_child(&store, "grandchild", A, 2, "deeper");
    let faulty = Faulty::new(query(&store, &[]));
    assert_eq!(list(&faulty, P).unwrap(), [healthy(A)]);
    assert!(faulty.calls().iter().all(|c| !c.ends_with("grandchild")), "{:?}", faulty.calls());
}

#[test]
fn an_abort_between_candidates_stops_before_the_next_listing() {
    // 35
    let (_dir, store) = family();
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let faulty = Faulty {
        seqs: hook(move |_, _| {
            stop.cancel();
            None
        }),
        ..Faulty::new(query(&store, &[]))
    };
    assert_cancelled(list_with(&faulty, P, &cancel));
    assert_eq!(faulty.calls(), [format!("trace {P}"), format!("events {A}")]);
}

#[test]
fn the_trace_gets_the_signal_and_an_abort_during_it_is_cancelled() {
    // 36: the backend rejects with its own error after the abort; the result is still CANCELLED.
    let (_dir, store) = family();
    let cancel = CancellationToken::new();
    let faulty = Faulty {
        trace: hook(|_, token| {
            token.expect("the trace gets a token").cancel();
            query_fault(QueryError::PersistenceFailed("aborted mid-scan".into()))
        }),
        ..Faulty::new(query(&store, &[]))
    };
    assert_cancelled(list_with(&faulty, P, &cancel));
    assert!(cancel.is_cancelled(), "the trace was given the listing's own token");
}

#[test]
fn the_exact_read_gets_the_signal_and_an_abort_there_is_cancelled() {
    // 37
    let (_dir, store) = family();
    let cancel = CancellationToken::new();
    let faulty = Faulty {
        read: hook(|_, token| {
            token.expect("the read gets a token").cancel();
            query_fault(QueryError::EventNotFound { session_id: A.into(), seq: 0 })
        }),
        ..Faulty::new(query(&store, &[]))
    };
    assert_cancelled(list_with(&faulty, P, &cancel));
    assert!(cancel.is_cancelled(), "the read was given the listing's own token");
}

#[test]
fn an_abort_right_after_a_read_is_cancelled_with_one_read_made() {
    // 38
    let (_dir, store) = family();
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let faulty =
        Faulty { edit: Some(Box::new(move |_: &mut Window| stop.cancel())), ..Faulty::new(query(&store, &[])) };
    assert_cancelled(list_with(&faulty, P, &cancel));
    assert_eq!(faulty.calls().iter().filter(|c| c.starts_with("read")).count(), 1);
}

#[test]
fn a_diagnostic_failure_while_aborted_is_cancelled_not_a_partial_result() {
    // 39
    let (_dir, store) = family();
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let faulty = Faulty {
        seqs: hook(move |id, _| {
            (id == B).then(|| {
                stop.cancel();
                QueryFault::Query(QueryError::SessionNotFound(B.into()))
            })
        }),
        ..Faulty::new(query(&store, &[]))
    };
    assert_cancelled(list_with(&faulty, P, &cancel));
}

#[test]
fn a_pre_aborted_signal_is_cancelled_before_any_read() {
    // 40
    let (_dir, store) = family();
    let cancel = CancellationToken::new();
    cancel.cancel();
    let faulty = Faulty::new(query(&store, &[]));
    assert_cancelled(list_with(&faulty, P, &cancel));
    assert!(faulty.calls().is_empty(), "{:?}", faulty.calls());
}

#[test]
fn a_parent_without_children_lists_nothing() {
    // 41
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    assert!(list(&query(&store, &[]), P).unwrap().is_empty());
}

#[test]
fn the_session_query_is_built_without_touching_storage() {
    // 42: dsh imports the session-query runtime lazily inside listChildren. kin has no dynamic
    // imports; the nearest equivalent is that building the query (at runtime start) reads and
    // creates nothing: only a listing does work.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("not-yet");
    let q = query(&SessionStore::new(root.clone()), &[]);
    assert!(!root.exists());
    assert_eq!(list(&q, P).unwrap_err().code.code(), "SESSION_QUERY_SESSION_NOT_FOUND");
    assert!(!root.exists(), "listing created nothing");
}

#[test]
fn listing_writes_nothing_and_leaves_torn_tails_and_open_turns_alone() {
    // 43, 70: inspect's valid prefix; no truncation, no closers, no catalog events. A second
    // descriptor in the torn (newline-less) tail is not part of the log.
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    let mut crashed =
        child_session(&store, header(A, Some(P), 1), vec![descriptor_event(0, continuable("a").to_value())]);
    crashed.append("turn/start", json!({"turn": 2, "trigger": {"kind": "message", "source": {"kind": "user"}}}));
    crashed.flush().unwrap();
    let events = crashed.events().len() as u64;
    drop(crashed);
    let torn = ev(events, DESCRIPTOR_EVENT, continuable("a again").to_value()).to_string();
    let mut file = std::fs::OpenOptions::new().append(true).open(log_path(&store, A)).unwrap();
    file.write_all(torn.as_bytes()).unwrap();
    drop(file);
    continuable_child(&store, B, P, 2, "label child-b");
    let before = snapshot(store.root());
    let q = query(&store, &[]);
    assert_eq!(list(&q, P).unwrap(), [cont(A, "a", Activity::Inactive), healthy(B)]);
    let listed = q.list_events(A).unwrap();
    assert_eq!(listed.len() as u64, events);
    assert_eq!(listed.last().unwrap().kind, "turn/start", "the open turn is not closed");
    assert_eq!(snapshot(store.root()), before, "listing wrote nothing");
}

#[test]
fn only_a_candidate_with_exactly_one_descriptor_is_read_twice() {
    // 44
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    fork_child(&store, "fork", P, 1);
    let mut twice =
        child_session(&store, header("twice", Some(P), 2), vec![descriptor_event(0, continuable("t").to_value())]);
    twice.append(DESCRIPTOR_EVENT, continuable("t").to_value());
    twice.flush().unwrap();
    continuable_child(&store, A, P, 3, "label child-a");
    let faulty = Faulty::new(query(&store, &[]));
    assert_eq!(list(&faulty, P).unwrap(), [diag("twice", Reason::Corrupt), healthy(A)]);
    assert_eq!(
        faulty.calls(),
        [format!("trace {P}"), "events fork".into(), "events twice".into(), format!("events {A}"), format!("read {A}")]
    );
}

// ---------------------------------------------------------------------------------------------
// G. Session query behaviour relied on

fn ids(records: &[SessionRecord]) -> Vec<String> {
    records.iter().map(|r| r.header.id.clone()).collect()
}

#[test]
fn a_trace_has_ancestors_outward_and_descendants_as_a_sorted_tree() {
    let (_dir, store) = store();
    parent_log(&store, "root", 0);
    continuable_child(&store, "mid", "root", 1, "m");
    continuable_child(&store, "leaf-2", "mid", 3, "l2");
    continuable_child(&store, "leaf-1", "mid", 2, "l1");
    continuable_child(&store, "deep", "leaf-1", 4, "d");
    continuable_child(&store, "top", "mid-less", 5, "t");
    let q = query(&store, &["mid"]);
    let cancel = CancellationToken::new();
    let trace = q.trace_session("deep", &cancel).unwrap();
    assert_eq!(ids(&trace.ancestors), ["leaf-1", "mid", "root"], "immediate parent first");
    assert_eq!(trace.lineage, Lineage::Complete { root: "root".into() });
    let trace = q.trace_session("mid", &cancel).unwrap();
    assert!(trace.target.live && trace.target.persisted);
    let tree: Vec<(String, Vec<String>)> = trace
        .descendants
        .iter()
        .map(|n| (n.session.header.id.clone(), n.descendants.iter().map(|d| d.session.header.id.clone()).collect()))
        .collect();
    assert_eq!(tree, [("leaf-1".to_string(), vec!["deep".to_string()]), ("leaf-2".to_string(), vec![])]);
    let orphan = q.trace_session("top", &cancel).unwrap();
    assert_eq!(orphan.lineage, Lineage::Incomplete { unresolved_parent_id: "mid-less".into() });
}

#[test]
fn a_lineage_cycle_is_invalid_lineage_and_fails_the_listing() {
    let (_dir, store) = store();
    write_raw(&store, &header("x", Some("y"), 0), &[]);
    write_raw(&store, &header("y", Some("x"), 1), &[]);
    write_raw(&store, &header("self", Some("self"), 2), &[]);
    let q = query(&store, &[]);
    let cancel = CancellationToken::new();
    assert_eq!(q.trace_session("x", &cancel).unwrap_err().code(), "SESSION_QUERY_INVALID_LINEAGE");
    assert_eq!(q.trace_session("self", &cancel).unwrap_err().code(), "SESSION_QUERY_INVALID_LINEAGE");
    assert_eq!(list(&q, "x").unwrap_err().code.code(), "SESSION_QUERY_INVALID_LINEAGE");
}

/// A source whose live side disagrees with storage about one session's immutable header.
struct Conflicting {
    inner: StoreSource,
    live: SessionHeader,
}

impl SessionSource for Conflicting {
    fn records(&self, cancel: &CancellationToken) -> Result<Vec<SessionRecord>, QueryError> {
        let persisted = self.inner.records(cancel)?.into_iter().map(|r| r.header).collect();
        merge_records(vec![Arc::new(self.live.clone())], persisted)
    }

    fn log(&self, id: &str) -> Result<SessionLog, QueryError> {
        self.inner.log(id)
    }
}

#[test]
fn a_live_persisted_header_conflict_anywhere_fails_the_whole_listing() {
    // 71: an unrelated session's conflict hides otherwise healthy children.
    let (_dir, store) = family();
    parent_log(&store, "unrelated", 9);
    let mut live = header("unrelated", None, 9);
    live.created_at = 10;
    let q = SessionQuery::new(Conflicting { inner: StoreSource::persisted_only(store.clone()), live });
    assert_eq!(q.trace_session(P, &CancellationToken::new()).unwrap_err().code(), "SESSION_QUERY_SOURCE_CONFLICT");
    assert_eq!(list(&q, P).unwrap_err().code.code(), "SESSION_QUERY_SOURCE_CONFLICT");
    // The same live header without a conflict merges into one live, persisted record.
    let agreeing = SessionQuery::new(Conflicting {
        inner: StoreSource::persisted_only(store.clone()),
        live: store.inspect("unrelated").unwrap().header,
    });
    let trace = agreeing.trace_session("unrelated", &CancellationToken::new()).unwrap();
    assert!(trace.target.live && trace.target.persisted);
    assert_eq!(list(&agreeing, P).unwrap(), [healthy(A), healthy(B), healthy(C)]);
}

#[test]
fn read_event_windows_are_bounded_and_missing_events_are_not_found() {
    let (_dir, store) = family();
    let q = query(&store, &[]);
    let cancel = CancellationToken::new();
    let read = |seq: u64, before: u64, after: u64| {
        q.read_event(&ReadRequest { session_id: A.into(), seq, before, after }, &cancel)
    };
    // descriptor, end-seed, turn/start, user, chunk, assistant, turn/end
    let window = read(3, 2, 50).unwrap();
    assert_eq!((window.start_seq, window.end_seq, window.target.seq), (1, 6, 3));
    assert_eq!(window.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6]);
    assert_eq!(read(0, 51, 0).unwrap_err().code(), "SESSION_QUERY_INVALID_WINDOW");
    assert_eq!(read(0, 0, 51).unwrap_err().code(), "SESSION_QUERY_INVALID_WINDOW");
    assert_eq!(read(99, 0, 0).unwrap_err(), QueryError::EventNotFound { session_id: A.into(), seq: 99 });
    let missing = q.read_event(&ReadRequest::exact("nobody", 0), &cancel).unwrap_err();
    assert_eq!(missing.code(), "SESSION_QUERY_SESSION_NOT_FOUND");
    // The exact read of a descriptor (served from the derived summary) equals a full read.
    let exact = read(0, 0, 0).unwrap();
    let full = read(0, 0, 1).unwrap();
    assert_eq!((exact.session, exact.target), (full.session, full.target.clone()));
    assert_eq!(full.target.kind, DESCRIPTOR_EVENT);
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let aborted = q.read_event(&ReadRequest::exact(A, 0), &cancelled).unwrap_err();
    assert_eq!(aborted.code(), "SESSION_QUERY_ABORTED");
}

#[test]
fn a_listing_stats_each_log_once_cold_and_warm() {
    // Issue 23: the trace's scan stats every log (one `fstatat`); the listing's reads of each
    // candidate (its descriptor seqs, the exact read, the inbox) answer as of that scan instead of
    // statting the log three more times. Five logs: the parent, three children, one unrelated.
    let (_dir, store) = family();
    parent_log(&store, "22222222-2222-4222-8222-222222222222", 9);
    let q = query(&store, &[]);
    let listing = [healthy(A), healthy(B), healthy(C)];
    assert_eq!(list(&q, P).unwrap(), listing);
    assert_eq!(q.source().io().stats, 5, "cold: one stat per log");
    for round in 1..=3 {
        assert_eq!(list(&q, P).unwrap(), listing);
        assert_eq!(q.source().io().stats, 5 * (round + 1), "warm: one stat per log per listing");
    }
    let tree = kin::testkit::subagent::catalog::list_tree(Some(&q), P, 8, &CancellationToken::new()).unwrap();
    assert_eq!(tree.into_iter().map(|t| t.entry).collect::<Vec<_>>(), listing);
    assert_eq!(q.source().io().stats, 25, "the agent tree too");
    // Outside a listing nothing is pinned: a read checks the log it reads.
    assert_eq!(q.event_seqs(A, &Kind::SubagentDescriptor).unwrap(), [0]);
    assert_eq!(q.source().io().stats, 26);
}

/// Rewrites `path` with `text` and sets its mtime at least a second past the one it had, so
/// that a same-length rewrite is told by its mtime on any filesystem, without waiting for a tick.
fn rewrite_later(path: &Path, text: &str) {
    let before = std::fs::metadata(path).unwrap().modified().unwrap();
    std::fs::write(path, text).unwrap();
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now().max(before + Duration::from_secs(1))).unwrap();
}

#[test]
fn the_derived_summary_follows_every_change_of_a_log() {
    // The per-log summary is a cache keyed by (path, length, mtime), never an authority: after
    // each hand edit the warm query answers what a fresh one does.
    let (_dir, store) = family();
    let warm = query(&store, &[]);
    assert_eq!(list(&warm, P).unwrap(), [healthy(A), healthy(B), healthy(C)]);
    let path = log_path(&store, A);
    let original = std::fs::read_to_string(&path).unwrap();
    let events = original.lines().count() as u64 - 1;
    let second = ev(events, DESCRIPTOR_EVENT, continuable("again").to_value());
    let check = |expected: ListEntry| {
        let fresh = list(&query(&store, &[]), P).unwrap();
        assert_eq!(fresh, [expected, healthy(B), healthy(C)]);
        assert_eq!(list(&warm, P).unwrap(), fresh);
    };
    std::fs::write(&path, format!("{original}{second}\n")).unwrap();
    check(diag(A, Reason::Corrupt));
    // Same length as the original: only the mtime tells the change.
    let future = original.replacen("\"version\":2", "\"version\":3", 1);
    assert_eq!(future.len(), original.len());
    rewrite_later(&path, &future);
    check(diag(A, Reason::Unsupported));
    rewrite_later(&path, &original);
    check(healthy(A));
}

#[test]
fn a_log_first_read_exactly_still_joins_the_corpus() {
    // An exact read caches a log no scan has seen yet; the next listing must still see it as
    // new (its cached length and mtime match the file, so only the read can say so).
    let (_dir, store) = family();
    let warm = query(&store, &[]);
    assert_eq!(list(&warm, P).unwrap(), [healthy(A), healthy(B), healthy(C)]);
    let d = "child-d";
    continuable_child(&store, d, P, 4, &format!("label {d}"));
    assert_eq!(warm.event_seqs(d, &Kind::SubagentDescriptor).unwrap(), [0]);
    assert_eq!(list(&warm, P).unwrap(), [healthy(A), healthy(B), healthy(C), healthy(d)]);
    // A child that only grew keeps its place, and its new state is read.
    let mut session = store.load(d).unwrap();
    session.append(DESCRIPTOR_EVENT, continuable("again").to_value());
    session.flush().unwrap();
    drop(session);
    assert_eq!(warm.event_seqs(d, &Kind::SubagentDescriptor).unwrap().len(), 2);
    assert_eq!(list(&warm, P).unwrap(), [healthy(A), healthy(B), healthy(C), diag(d, Reason::Corrupt)]);
}

#[test]
fn the_cached_corpus_follows_logs_added_removed_and_rewritten() {
    // The corpus (every header, merged) is derived state as well: each call rescans, and a warm
    // query answers what a fresh one does after logs are added (in a new project directory too),
    // re-parented by a same-length hand edit, repaired and removed; made unreadable, it stays a
    // diagnostic where it was known.
    let (_dir, store) = family();
    let warm = query(&store, &[]);
    let check = |expected: &[&str]| {
        let fresh = list(&query(&store, &[]), P).unwrap();
        assert_eq!(fresh, expected.iter().map(|id| healthy(id)).collect::<Vec<_>>());
        assert_eq!(list(&warm, P).unwrap(), fresh);
    };
    check(&[A, B, C]);
    let d = "child-d";
    let mut elsewhere = header(d, Some(P), 4);
    elsewhere.cwd = Some("/elsewhere".into());
    let seed = vec![descriptor_event(0, continuable(&format!("label {d}")).to_value())];
    child_session(&store, elsewhere, seed).flush().unwrap();
    check(&[A, B, C, d]);
    let stray = "child-stray";
    let other = "22222222-2222-4222-8222-222222222222";
    continuable_child(&store, stray, other, 5, &format!("label {stray}"));
    check(&[A, B, C, d]);
    let path = log_path(&store, stray);
    let text = std::fs::read_to_string(&path).unwrap();
    let reparented = text.replacen(other, P, 1);
    assert_eq!(reparented.len(), text.len());
    rewrite_later(&path, &reparented);
    check(&[A, B, C, d, stray]);
    std::fs::write(&path, "not a header\n").unwrap();
    // A fresh query never read the broken header, so nothing names stray's parent; the warm one
    // read it before and keeps it listed, `unavailable` (issue 17: never silently gone).
    assert_eq!(list(&query(&store, &[]), P).unwrap(), [A, B, C, d].map(healthy));
    assert_eq!(
        list(&warm, P).unwrap(),
        [healthy(A), healthy(B), healthy(C), healthy(d), diag(stray, Reason::Unavailable)]
    );
    std::fs::write(&path, &reparented).unwrap();
    check(&[A, B, C, d, stray]);
    std::fs::remove_dir_all(log_path(&store, B).parent().unwrap()).unwrap();
    check(&[A, C, d, stray]);
    std::fs::remove_dir_all(log_path(&store, d).parent().unwrap().parent().unwrap()).unwrap();
    check(&[A, C, stray]);
}

// ---------------------------------------------------------------------------------------------
// C. list_agents

fn caller_ctx(id: &str, cancel: CancellationToken) -> ToolContext {
    let caller =
        Caller { header: header(id, None, 0), depth: 0, route: ModelRoute::parse("test/m").unwrap(), history: None };
    ToolContext { caller: Some(Arc::new(caller)), ..ToolContext::detached(None, cancel) }
}

fn text_of(output: &kin::testkit::tools::ToolOutput) -> &str {
    output.content[0]["text"].as_str().unwrap()
}

#[tokio::test]
async fn an_empty_projection_renders_no_subagents() {
    // 46: no children, or only one-shot ones.
    let (_dir, store) = store();
    parent_log(&store, P, 0);
    let tool = ListAgentsTool(Some(shared(query(&store, &[]))));
    let output = tool.execute(json!({}), caller_ctx(P, CancellationToken::new())).await.unwrap();
    assert_eq!(text_of(&output), "(no subagents)");
    one_shot_child(&store, A, P, 1, Some("one-shot"));
    let output = tool.execute(json!({}), caller_ctx(P, CancellationToken::new())).await.unwrap();
    assert_eq!(text_of(&output), "(no subagents)");
}

#[test]
fn the_projection_drops_one_shot_children_and_keeps_diagnostics() {
    // 47
    let real = "22222222-2222-4222-8222-222222222222";
    let entries = [
        child("one-shot-child", Mode::OneShot, None, Activity::Inactive),
        cont(real, "real child", Activity::Inactive),
        cont("running-child", "still working", Activity::Running),
        diag("broken-child", Reason::Corrupt),
    ];
    assert_eq!(
        render(&entries),
        format!(
            "{real} [complete] \u{2014} real child\nrunning-child [running] \u{2014} still working\nbroken-child [diagnostic: corrupt]"
        )
    );
    assert_eq!(render(&[]), "(no subagents)");
    let others = [diag("x", Reason::Unsupported), diag("y", Reason::Unavailable)];
    assert_eq!(render(&others), "x [diagnostic: unsupported]\ny [diagnostic: unavailable]");
}

#[tokio::test]
async fn the_tool_forwards_its_cancellation_signal() {
    // 48: the tool's token is the listing's signal.
    let (_dir, store) = family();
    let faulty = Arc::new(Faulty {
        trace: hook(|_, token| {
            token.expect("the trace gets a token").cancel();
            query_fault(QueryError::PersistenceFailed("aborted".into()))
        }),
        ..Faulty::new(query(&store, &[]))
    });
    let service: Arc<dyn QueryService> = faulty.clone();
    let token = CancellationToken::new();
    let err = ListAgentsTool(Some(service)).execute(json!({}), caller_ctx(P, token.clone())).await.unwrap_err();
    assert!(token.is_cancelled(), "the listing got the tool call's own token");
    assert_eq!((err.code.as_str(), err.message.as_str()), ("CANCELLED", "subagent listing was cancelled"));
    assert_eq!(faulty.calls(), [format!("trace {P}")]);
}

#[tokio::test]
async fn list_agents_needs_a_calling_agent() {
    // 50
    let (_dir, store) = family();
    let mut registry = ToolRegistry::new();
    registry.register(Arc::new(ListAgentsTool(Some(shared(query(&store, &[]))))));
    let ctx = ToolContext::detached(None, CancellationToken::new());
    let err = registry.call("list_agents", "{}", ctx).await.unwrap_err();
    assert_eq!(err.message, "list_agents requires a calling agent (exec.agent was undefined)");
    assert!(err.message.contains("requires a calling agent"));
}

#[test]
fn registering_list_agents_again_keeps_one_tool() {
    // 51: dsh disposes the plugin fiber on HMR; kin has no hot reload. The nearest property: the
    // registry holds one `list_agents` however often it is registered.
    let mut registry = ToolRegistry::new();
    registry.register(Arc::new(ListAgentsTool(None)));
    registry.register(Arc::new(ListAgentsTool(None)));
    assert_eq!(registry.names().iter().filter(|n| *n == "list_agents").count(), 1);
}

#[tokio::test]
async fn list_agents_without_session_query_fails_at_call_time() {
    // 52: dsh injects sessionQuery at plugin load (`inject: ['tools','subagents','sessionQuery']`,
    // name `tool-subagent-list-agents`); kin has no plugin loader. The runtime always builds the
    // tool over its query; a tool built without one fails each call with the service's error.
    let tool = ListAgentsTool(None);
    let err = tool.execute(json!({}), caller_ctx(P, CancellationToken::new())).await.unwrap_err();
    assert_eq!(err.code, "SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE");
    assert_eq!(err.message, QUERY_UNAVAILABLE);
}

// ---------------------------------------------------------------------------------------------
// The real runtime with the scripted model.

fn user_text(text: &str) -> Vec<Value> {
    vec![json!({"type": "text", "text": text})]
}

/// The texts of a session's tool results, in log order.
fn tool_results(store: &SessionStore, id: &str) -> Vec<String> {
    store
        .inspect(id)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.kind == "tool/result")
        .map(|e| e.data["message"]["content"][0]["content"][0]["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn turn_ends(store: &SessionStore, id: &str) -> usize {
    store.inspect(id).map(|s| s.events.iter().filter(|e| e.kind == "turn/end").count()).unwrap_or(0)
}

#[tokio::test]
async fn list_agents_is_registered_once_without_parameters() {
    // 45
    let dir = tempfile::tempdir().unwrap();
    let (rt, model) = runtime_with(dir.path(), ScriptedModel::new([ReplayEntry::Chunks(text_response(&["hi"]))]), "");
    let (parent_id, _) = parent(&rt, dir.path());
    assert_eq!(rt.prompt(&parent_id, user_text("hello")).unwrap().await.unwrap(), TurnEnd::Completed);
    let requests = model.requests();
    let tools = &requests[0].tools;
    let listed: Vec<_> = tools.iter().filter(|t| t.name == "list_agents").collect();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].parameters, json!({"type": "object", "properties": {}}));
    assert_eq!(listed[0].description, DESCRIPTION);
    assert!(listed[0].description.contains("send_message"));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_a_settled_continuable_child_lists_complete_and_a_one_shot_sibling_is_omitted() {
    // 49 (and 54's shape): real agent loop, JSONL store, continuation manager, session query.
    let dir = tempfile::tempdir().unwrap();
    let background = r#"{"description":"summarize the doc","prompt":"summarize it","run_in_background":true}"#;
    let model = ScriptedModel::new([])
        .route(
            "delegate",
            [
                ReplayEntry::Chunks(tool_call_response("bg", "subagent", background)),
                ReplayEntry::Chunks(tool_call_response(
                    "fg",
                    "subagent",
                    r#"{"description":"quick check","prompt":"check it"}"#,
                )),
                ReplayEntry::Chunks(text_response(&["started"])),
            ],
        )
        .route("summarize it", [ReplayEntry::Chunks(text_response(&["summary"]))])
        .route("check it", [ReplayEntry::Chunks(text_response(&["checked"]))])
        .route(
            "list them",
            [
                ReplayEntry::Chunks(tool_call_response("ls", "list_agents", "{}")),
                ReplayEntry::Chunks(text_response(&["listed"])),
            ],
        );
    let (rt, _) = runtime_with(dir.path(), model, "");
    let (parent_id, _) = parent(&rt, dir.path());
    assert_eq!(rt.prompt(&parent_id, user_text("delegate")).unwrap().await.unwrap(), TurnEnd::Completed);
    let results = tool_results(rt.store(), &parent_id);
    let child = results[0].strip_prefix("started subagent ").expect("a background start").to_string();
    assert_eq!(results[1], "checked", "the one-shot sibling ran in the foreground");
    until("the background child to settle", || {
        !rt.continuation().is_resident(&child) && rt.live_agent(&child).is_none()
    })
    .await;
    let children = rt
        .store()
        .list()
        .into_iter()
        .filter(|s| s.header.parent_session.as_deref() == Some(parent_id.as_str()))
        .count();
    assert_eq!(children, 2);
    assert_eq!(rt.prompt(&parent_id, user_text("list them")).unwrap().await.unwrap(), TurnEnd::Completed);
    let results = tool_results(rt.store(), &parent_id);
    assert_eq!(results.last().unwrap(), &format!("{child} [complete] \u{2014} summarize the doc"));
    assert!(rt.live_agent(&child).is_none(), "listing created no agent");
    let descriptors = rt.store().inspect(&child).unwrap().events.iter().filter(|e| e.kind == DESCRIPTOR_EVENT).count();
    assert_eq!(descriptors, 1, "listing appended nothing");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_message_works_without_session_query() {
    // 53: `send_message` is built over the continuation manager alone; a `list_agents` without a
    // query fails while `send_message` delivers.
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::new([])
        .route("first", [ReplayEntry::Chunks(text_response(&["one"])), ReplayEntry::Chunks(text_response(&["two"]))]);
    let (rt, _) = runtime_with(dir.path(), model, "");
    let (parent_id, caller) = parent(&rt, dir.path());
    let (child, _) = rt.continuation().start("spawn", "worker".into(), start_request(&caller, "first")).await.unwrap();
    until("the child to settle", || !rt.continuation().is_resident(&child)).await;
    let ctx = ToolContext { caller: Some(caller.clone()), ..ToolContext::detached(None, CancellationToken::new()) };
    let err = ListAgentsTool(None).execute(json!({}), ctx.clone()).await.unwrap_err();
    assert_eq!(err.code, "SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE");
    let sent = SendMessageTool(rt.continuation().clone())
        .execute(json!({"subagent_id": child, "message": "second"}), ctx)
        .await
        .unwrap();
    assert_eq!(text_of(&sent), format!("message queued as the next turn for subagent {child}"));
    until("the second turn", || turn_ends(rt.store(), &child) == 2).await;
    assert_eq!(parent_id, caller.header.id);
    rt.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// The real binary over pipes: restart, then hand-corrupted child logs.

/// `kin acp` over pipes, in replay mode and `bypass`.
fn start_kin(sessions: &Path, replay: &Path, cwd: &Path) -> Peer {
    let mut command = common::acp(sessions, Some(replay));
    command.args(["--permission-mode", "bypass"]).current_dir(cwd);
    Peer::spawn(&mut command)
}

fn prompt(kin: &mut Peer, session: &str, text: &str) {
    let answer = kin.call("session/prompt", json!({"sessionId": session, "prompt": user_text(text)}), common::WAIT);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
}

/// One `list_agents` turn; returns the tool's text from the parent's log.
fn list_agents(kin: &mut Peer, store: &SessionStore, parent: &str) -> String {
    prompt(kin, parent, "List your subagents.");
    tool_results(store, parent).pop().unwrap()
}

fn chunk_lines(seq: &mut u64, turn: u64, step: u64, chunks: Vec<Value>) -> Vec<String> {
    chunks
        .into_iter()
        .map(|chunk| {
            let line = json!({"type": "assistant/chunk", "seq": *seq, "time": 0, "data": {"turn": turn, "step": step, "chunk": chunk}});
            *seq += 1;
            line.to_string()
        })
        .collect()
}

fn text_chunks(text: &str) -> Vec<Value> {
    vec![
        json!({"type": "block-start", "index": 0, "blockType": "text"}),
        json!({"type": "text-delta", "index": 0, "text": text}),
        json!({"type": "block-end", "index": 0, "block": {"type": "text", "text": text}}),
        json!({"type": "usage", "usage": {"inputTokens": 20, "outputTokens": 1}}),
        json!({"type": "finish", "reason": {"kind": "stop"}}),
    ]
}

fn call_chunks(calls: &[(String, &str, Value)]) -> Vec<Value> {
    let mut chunks = Vec::new();
    for (i, (id, name, args)) in calls.iter().enumerate() {
        let args = args.to_string();
        chunks.push(json!({"type": "block-start", "index": i, "blockType": "tool-call"}));
        chunks.push(json!({"type": "tool-call-delta", "index": i, "id": id, "name": name, "argumentsDelta": args}));
        chunks.push(json!({"type": "block-end", "index": i, "block": {"type": "tool-call", "id": id, "name": name, "arguments": args}}));
    }
    chunks.push(json!({"type": "usage", "usage": {"inputTokens": 20, "outputTokens": 10}}));
    chunks.push(json!({"type": "finish", "reason": {"kind": "tool-calls"}}));
    chunks
}

/// A replay directory: the parent starts one background child per label (one step), then
/// answers `listings` prompts with one `list_agents` call each; each child replies once.
fn write_replay(dir: &Path, labels: &[&str], listings: u64) {
    let mut seq = 0;
    let parent = json!({"type": "session", "version": 0, "id": "{{sessionId}}", "createdAt": 0, "cwd": "{{cwd}}", "delegationDepth": 0});
    let starts: Vec<(String, &str, Value)> = labels
        .iter()
        .enumerate()
        .map(|(i, label)| {
            let args = json!({"description": label, "prompt": format!("Reply as {label}."), "run_in_background": true});
            (format!("start{i}"), "subagent", args)
        })
        .collect();
    let mut lines = vec![parent.to_string()];
    lines.extend(chunk_lines(&mut seq, 1, 1, call_chunks(&starts)));
    lines.extend(chunk_lines(&mut seq, 1, 2, text_chunks("STARTED")));
    for turn in 2..2 + listings {
        lines.extend(chunk_lines(&mut seq, turn, 1, call_chunks(&[(format!("list{turn}"), "list_agents", json!({}))])));
        lines.extend(chunk_lines(&mut seq, turn, 2, text_chunks("LISTED")));
    }
    std::fs::write(dir.join("session.jsonl"), lines.join("\n") + "\n").unwrap();
    for (i, label) in labels.iter().enumerate() {
        let header = json!({"type": "session", "version": 0, "id": "{{sessionId}}", "createdAt": i + 1, "cwd": "{{cwd}}", "parentSession": "{{sessionId}}", "origin": "subagent", "delegationDepth": 1});
        let prompt = json!({"type": "user/message", "seq": 0, "time": 0, "data": {"content": [{"type": "text", "text": format!("Reply as {label}.")}], "source": {"kind": "user"}, "role": "user", "id": "x"}, "surfaceOp": "append"});
        let mut seq = 1;
        let mut lines = vec![header.to_string(), prompt.to_string()];
        lines.extend(chunk_lines(&mut seq, 1, 1, text_chunks(label)));
        std::fs::write(dir.join(format!("session.{}.jsonl", i + 1)), lines.join("\n") + "\n").unwrap();
    }
}

/// The direct children of `parent` on disk, in sibling order.
fn children_of(store: &SessionStore, parent: &str) -> Vec<String> {
    let mut children: Vec<SessionHeader> =
        store.list().into_iter().map(|s| s.header).filter(|h| h.parent_session.as_deref() == Some(parent)).collect();
    children.sort_by(sibling_order);
    children.into_iter().map(|h| h.id).collect()
}

#[test]
fn restarted_kin_lists_its_children_complete_and_hand_corruption_yields_the_matching_diagnostic() {
    let tmp = tempfile::tempdir().unwrap();
    let (replay, cwd, sessions) = (tmp.path().join("replay"), tmp.path().join("cwd"), tmp.path().join("sessions"));
    for dir in [&replay, &cwd] {
        std::fs::create_dir_all(dir).unwrap();
    }
    write_replay(&replay, &["Alpha", "Beta", "Gamma"], 5);
    let store = SessionStore::new(sessions.clone());

    // Three background children start and settle; then kin is killed.
    let mut kin = start_kin(&sessions, &replay, &cwd);
    kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), common::WAIT);
    let created = kin.call("session/new", json!({"cwd": cwd.display().to_string(), "mcpServers": []}), common::WAIT);
    let parent = created["result"]["sessionId"].as_str().expect("a session id").to_string();
    prompt(&mut kin, &parent, "Start three children.");
    common::until_blocking("three settled children", || {
        let children = children_of(&store, &parent);
        children.len() == 3 && children.iter().all(|c| turn_ends(&store, c) == 1)
    });
    drop(kin); // Killed: a dropped Peer kills a kin still running.

    // A new process lists them from storage alone: complete, with their labels.
    let mut kin = start_kin(&sessions, &replay, &cwd);
    kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), common::WAIT);
    let loaded = kin.call(
        "session/load",
        json!({"sessionId": parent, "cwd": cwd.display().to_string(), "mcpServers": []}),
        common::WAIT,
    );
    assert!(loaded.get("error").is_none(), "{loaded}");
    let children = children_of(&store, &parent);
    let label = |id: &str| match Descriptor::fold(store.inspect(id).unwrap().events.iter()).unwrap() {
        Some(Descriptor::Continuable { label, .. }) => label,
        other => panic!("{id} has no continuable descriptor: {other:?}"),
    };
    let lines: Vec<String> =
        children.iter().map(|id| format!("{id} [complete] \u{2014} {}", label(id.as_str()))).collect();
    let mut labels: Vec<String> = children.iter().map(|id| label(id.as_str())).collect();
    labels.sort();
    assert_eq!(labels, ["Alpha", "Beta", "Gamma"]);
    assert_eq!(list_agents(&mut kin, &store, &parent), lines.join("\n"), "after the restart");

    // One child's log corrupted by hand, four ways; its siblings keep listing.
    let target = children[0].clone();
    let expect =
        |first: Option<String>| first.into_iter().chain(lines[1..].iter().cloned()).collect::<Vec<_>>().join("\n");
    let path = log_path(&store, &target);
    let original = std::fs::read_to_string(&path).unwrap();
    let descriptor = store.inspect(&target).unwrap().events.into_iter().find(|e| e.kind == DESCRIPTOR_EVENT).unwrap();
    let events = original.lines().count() as u64 - 1;

    let second = ev(events, DESCRIPTOR_EVENT, descriptor.data.to_value());
    std::fs::write(&path, format!("{original}{second}\n")).unwrap();
    assert_eq!(
        list_agents(&mut kin, &store, &parent),
        expect(Some(format!("{target} [diagnostic: corrupt]"))),
        "a second descriptor"
    );

    std::fs::write(&path, &original).unwrap();
    let bad = original.replacen("\"provider\":\"spawn\"", "\"provider\":7", 1);
    assert_ne!(bad, original);
    std::fs::write(&path, bad.as_bytes()).unwrap();
    assert_eq!(
        list_agents(&mut kin, &store, &parent),
        expect(Some(format!("{target} [diagnostic: corrupt]"))),
        "a bad payload"
    );

    std::fs::write(&path, &original).unwrap();
    let future =
        original.replacen("\"version\":2,\"mode\":\"continuable\"", "\"version\":3,\"mode\":\"continuable\"", 1);
    assert_ne!(future, original);
    std::fs::write(&path, future.as_bytes()).unwrap();
    assert_eq!(
        list_agents(&mut kin, &store, &parent),
        expect(Some(format!("{target} [diagnostic: unsupported]"))),
        "a future descriptor version"
    );

    // A deleted log is no longer in the corpus: the child is gone from the trace, so nothing
    // lists for it (`unavailable` needs the log to vanish between the trace and the read).
    std::fs::remove_file(path).unwrap();
    assert_eq!(list_agents(&mut kin, &store, &parent), expect(None), "a deleted log");
    drop(kin); // Killed: a dropped Peer kills a kin still running.
}

/// `kin bench --first-listing` (what the catalog bench runs for its cold figure): a kin process
/// just started lists a parent's children once, as its runtime's first listing does, and prints
/// one line of JSON with how many it listed, that listing's wall and CPU time and how many project
/// directories it listed.
#[test]
fn the_bench_s_first_listing_runs_in_a_new_kin_process_and_lists_the_children() {
    let (_dir, store) = family();
    // The index a listing leaves, which the new process's first listing reads.
    assert_eq!(list(&indexed(&store), P).unwrap().len(), 3);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kin"))
        .args(["bench", "--first-listing"])
        .arg(store.root())
        .arg(P)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    let figures: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(figures["listed"], 3, "{text}");
    assert!(figures["wallMs"].as_f64().is_some_and(|ms| ms > 0.0), "{text}");
    assert!(figures["cpuMs"].as_f64().is_some_and(|ms| ms >= 0.0), "{text}");
    // The family's directories are a moment old: none is memoized, so its one directory is listed.
    assert_eq!(figures["dirsListed"], 1, "{text}");
}

// ---------------------------------------------------------------------------------------------
// H. The derived catalog index (issue 23): headers and descriptors stay authoritative; an index
// that is stale, missing or corrupt in any way lists exactly what no index lists.

const D: &str = "child-d";
const E: &str = "child-e";

fn indexed(store: &SessionStore) -> SessionQuery {
    SessionQuery::new(StoreSource::persisted_only(store.clone()).with_index())
}

fn index_file(store: &SessionStore) -> PathBuf {
    kin::testkit::session::catalog_index::path(store.root()).unwrap()
}

/// Every kind of candidate below P: three continuable children, a labelled and an unlabelled
/// one-shot, an ordinary fork, two descriptors, an unsupported version, a grandchild below A;
/// and an unrelated family in another project directory.
fn index_corpus() -> (tempfile::TempDir, SessionStore) {
    let (dir, store) = family();
    one_shot_child(&store, D, P, 4, Some("d"));
    one_shot_child(&store, E, P, 5, None);
    fork_child(&store, "child-fork", P, 6);
    let mut twice = child_session(
        &store,
        header("child-twice", Some(P), 7),
        vec![descriptor_event(0, continuable("t").to_value())],
    );
    twice.append(DESCRIPTOR_EVENT, continuable("t").to_value());
    twice.flush().unwrap();
    let future = json!({"version": 3, "mode": "continuable", "provider": "spawn", "label": "x"});
    child_session(&store, header("child-future", Some(P), 8), vec![descriptor_event(0, future)]).flush().unwrap();
    continuable_child(&store, "grandchild", A, 9, "below a");
    let other = "33333333-3333-4333-8333-333333333333";
    let mut elsewhere = header(other, None, 10);
    elsewhere.cwd = Some("/elsewhere".into());
    store.create(elsewhere).unwrap().flush().unwrap();
    let mut child = header("child-elsewhere", Some(other), 11);
    child.cwd = Some("/elsewhere".into());
    child_session(&store, child, vec![descriptor_event(0, continuable("e").to_value())]).flush().unwrap();
    (dir, store)
}

/// What a listing shows, as text: `list_children`'s entries (or its error), the `list_agents`
/// rendering, and the agent tree.
fn listing_text(q: &dyn QueryService) -> String {
    let entries = list(q, P);
    let rendered = entries.as_ref().map(|e| render(e)).unwrap_or_default();
    let tree = kin::testkit::subagent::catalog::list_tree(Some(q), P, 8, &CancellationToken::new());
    format!("{entries:?}\n{rendered}\n{tree:?}")
}

/// The listing with no index at all.
fn unindexed(store: &SessionStore) -> String {
    listing_text(&query(store, &[]))
}

/// A fresh indexed query (a kin process after start) lists exactly what no index lists, cold
/// and warm; its file operations.
fn lists_as_without_index(store: &SessionStore, what: &str) -> kin::testkit::session::query::SourceIo {
    lists_as_unindexed(store, indexed(store), what)
}

/// `q`, fresh, lists exactly what no index lists, cold and warm; its file operations.
fn lists_as_unindexed(
    store: &SessionStore,
    q: SessionQuery<StoreSource>,
    what: &str,
) -> kin::testkit::session::query::SourceIo {
    let expected = unindexed(store);
    assert_eq!(listing_text(&q), expected, "{what}: cold");
    assert_eq!(listing_text(&q), expected, "{what}: warm");
    q.source().io()
}

/// A fresh indexed query that reads no log whole and no header: the index on disk is sound.
fn assert_index_used(store: &SessionStore, what: &str) {
    let io = lists_as_without_index(store, what);
    assert_eq!((io.whole_reads, io.header_reads), (0, 0), "{what}: the index is sound again: {io:?}");
    assert!(io.index_summaries > 0, "{what}: children are summarised from the index: {io:?}");
}

#[test]
fn the_first_listing_after_start_reads_the_index_not_logs() {
    let (dir, store) = index_corpus();
    assert_eq!(index_file(&store).parent(), Some(dir.path()), "the index sits beside the sessions directory");
    let before = snapshot(dir.path());
    let first = lists_as_without_index(&store, "no index yet");
    assert!(first.whole_reads >= 8, "without an index every candidate log is read whole: {first:?}");
    assert!(index_file(&store).is_file(), "the listing wrote the index");
    // Only the index was written: every log is byte for byte what it was, with its mtime.
    let after: Vec<_> = snapshot(dir.path())
        .into_iter()
        .filter(|(path, ..)| *path != index_file(&store) && *path != memo_file(&store))
        .collect();
    assert!(memo_file(&store).is_file(), "the directory memo is written beside it");
    assert!(after == before, "a listing writes the index (and the memo) and nothing else (no temp file is left)");
    let q = indexed(&store);
    assert_eq!(listing_text(&q), unindexed(&store));
    let io = q.source().io();
    assert_eq!((io.whole_reads, io.header_reads), (0, 0), "{io:?}");
    // One summary from the index per candidate (A, B, C, D, E, twice, future, the fork; the
    // grandchild through the tree), and no log opened; one stat per log per listing (the list,
    // the tree).
    assert_eq!(io.index_summaries, 9, "{io:?}");
    let logs = before.iter().filter(|(path, ..)| path.ends_with("session.jsonl")).count() as u64;
    assert_eq!(logs, 12);
    assert_eq!(io.stats, 2 * logs, "{io:?}");
    // The index does not grow a second copy of a listing's facts: unchanged, it is not written.
    let modified = std::fs::metadata(index_file(&store)).unwrap().modified().unwrap();
    assert_eq!(listing_text(&indexed(&store)), unindexed(&store));
    assert_eq!(std::fs::metadata(index_file(&store)).unwrap().modified().unwrap(), modified);
}

/// The index file's first line (parsed) and its entry lines.
fn index_parts(store: &SessionStore) -> (Value, Vec<String>) {
    let text = std::fs::read_to_string(index_file(store)).unwrap();
    let mut lines = text.lines().map(str::to_string);
    let head: Value = serde_json::from_str(&lines.next().unwrap()).unwrap();
    (head, lines.collect())
}

/// Writes an index of these entry lines with a first line that matches them (count and digest),
/// as kin would: only what the entries say is wrong.
fn write_index_entries(store: &SessionStore, head: &Value, entries: &[String]) {
    let body: String = entries.iter().map(|line| format!("{line}\n")).collect();
    let digest = format!("{:032x}", xxhash_rust::xxh3::xxh3_128(body.as_bytes()));
    let mut head = head.clone();
    head["entries"] = json!(entries.len());
    head["digest"] = json!(digest);
    std::fs::write(index_file(store), format!("{head}\n{body}")).unwrap();
}

fn entry_of(entries: &[String], session: &str) -> usize {
    entries
        .iter()
        .position(|line| serde_json::from_str::<Value>(line).unwrap()["session"] == session)
        .unwrap_or_else(|| panic!("no entry for {session} in {entries:?}"))
}

/// A named way to damage a file, and the damage.
type Corruption<'c> = (&'c str, Box<dyn Fn() + 'c>);

#[test]
fn every_corrupt_index_lists_as_without_one_and_is_rebuilt() {
    let (_dir, store) = index_corpus();
    lists_as_without_index(&store, "building it");
    let good = std::fs::read(index_file(&store)).unwrap();
    let text = String::from_utf8(good.clone()).unwrap();
    let (head, entries) = index_parts(&store);
    let edited = |f: &dyn Fn(&mut Vec<String>)| {
        let mut entries = entries.clone();
        f(&mut entries);
        entries
    };
    let set = |entries: &mut Vec<String>, session: &str, edit: &dyn Fn(&mut Value)| {
        let i = entry_of(entries, session);
        let mut entry: Value = serde_json::from_str(&entries[i]).unwrap();
        edit(&mut entry);
        entries[i] = entry.to_string();
    };
    let path = index_file(&store);
    let write = |bytes: Vec<u8>| {
        assert_ne!(bytes, good, "a corruption that leaves the file as it was");
        let path = path.clone();
        move || std::fs::write(&path, &bytes).unwrap()
    };
    let consistent = |entries: Vec<String>| {
        let head = head.clone();
        let store = store.clone();
        move || write_index_entries(&store, &head, &entries)
    };
    let corruptions: Vec<Corruption<'_>> = vec![
        ("missing", Box::new(|| std::fs::remove_file(index_file(&store)).unwrap())),
        ("empty", Box::new(write(Vec::new()))),
        ("truncated mid-line", Box::new(write(good[..good.len() / 2].to_vec()))),
        ("truncated after the first line", Box::new(write(text.as_bytes()[..text.find('\n').unwrap() + 1].to_vec()))),
        (
            "its last line cut off",
            Box::new(write(
                text.lines().take(entries.len()).map(|l| format!("{l}\n")).collect::<String>().into_bytes(),
            )),
        ),
        ("without its final newline", Box::new(write(good[..good.len() - 1].to_vec()))),
        ("garbage", Box::new(write((0..4096u32).map(|i| (i * 7919 % 251) as u8).collect()))),
        ("JSON of another shape", Box::new(write(b"{\"hello\": 1}\n[]\n".to_vec()))),
        (
            "another version",
            Box::new(write(text.replacen("\"kinCatalogIndex\":5", "\"kinCatalogIndex\":6", 1).into_bytes())),
        ),
        (
            "version 4 (descriptors read back, no ctimes)",
            Box::new(write(text.replacen("\"kinCatalogIndex\":5", "\"kinCatalogIndex\":4", 1).into_bytes())),
        ),
        (
            "version 2 (no titles)",
            Box::new(write(text.replacen("\"kinCatalogIndex\":5", "\"kinCatalogIndex\":2", 1).into_bytes())),
        ),
        (
            "version 1 (SHA-256 digests)",
            Box::new(write(text.replacen("\"kinCatalogIndex\":5", "\"kinCatalogIndex\":1", 1).into_bytes())),
        ),
        ("version 0", Box::new(write(text.replacen("\"kinCatalogIndex\":5", "\"kinCatalogIndex\":0", 1).into_bytes()))),
        (
            "an entry changed under its digest",
            Box::new(write(text.replacen("\"events\":", "\"events\":1", 1).into_bytes())),
        ),
        (
            "a count that does not match",
            Box::new(write(text.replacen(&format!("\"entries\":{}", entries.len()), "\"entries\":2", 1).into_bytes())),
        ),
        (
            "a duplicated entry",
            Box::new(consistent(edited(&|e| {
                let dup = e[0].clone();
                e.push(dup)
            }))),
        ),
        (
            "missing entries",
            Box::new(consistent(edited(&|e| e.retain(|line| !line.contains(A) && !line.contains("child-future"))))),
        ),
        ("no entries at all", Box::new(consistent(Vec::new()))),
        (
            "an entry for a log that does not exist",
            Box::new(consistent(edited(&|e| {
                let ghost = e[entry_of(e, B)].replace(B, "child-ghost");
                e.push(ghost);
            }))),
        ),
        (
            "an entry whose header is another session's",
            Box::new(consistent(edited(&|e| {
                let a: Value = serde_json::from_str(&e[entry_of(e, A)]).unwrap();
                set(e, B, &|entry| entry["header"] = a["header"].clone());
            }))),
        ),
        (
            "an entry whose descriptor line is another event's",
            Box::new(consistent(edited(&|e| {
                set(e, A, &|entry| entry["summary"]["descriptors"][0]["line"]["type"] = json!("session/end-seed"));
            }))),
        ),
        (
            "an entry whose descriptor line is not an event",
            Box::new(consistent(edited(&|e| {
                set(e, B, &|entry| entry["summary"]["descriptors"][0]["line"] = json!({"seq": 0}));
            }))),
        ),
        (
            "an entry whose descriptor line is not an object",
            Box::new(consistent(edited(&|e| {
                set(e, C, &|entry| entry["summary"]["descriptors"][0]["line"] = json!("a line"));
            }))),
        ),
        (
            "an entry without its ctime",
            Box::new(consistent(edited(&|e| {
                set(e, C, &|entry| {
                    entry.as_object_mut().unwrap().remove("ctime");
                });
            }))),
        ),
        (
            "an entry naming a descriptor at another seq",
            Box::new(consistent(edited(&|e| {
                set(e, D, &|entry| entry["summary"]["descriptors"][0]["seq"] = json!(0));
            }))),
        ),
        (
            "an entry with an unknown field",
            Box::new(consistent(edited(&|e| set(e, E, &|entry| entry["extra"] = json!(1))))),
        ),
        ("an entry that is not JSON", Box::new(consistent(edited(&|e| e[1] = "not json".into())))),
        (
            "a symlink to a sound index",
            Box::new(|| {
                let elsewhere = store.root().parent().unwrap().join("index-copy");
                std::fs::write(&elsewhere, &good).unwrap();
                std::fs::remove_file(index_file(&store)).unwrap();
                std::os::unix::fs::symlink(&elsewhere, index_file(&store)).unwrap();
            }),
        ),
        (
            "a FIFO",
            Box::new(|| {
                std::fs::remove_file(index_file(&store)).unwrap();
                let path = std::ffi::CString::new(index_file(&store).into_os_string().into_encoded_bytes()).unwrap();
                // SAFETY: a NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
            }),
        ),
        (
            "not readable (mode 000; root reads it anyway)",
            Box::new(|| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(index_file(&store), std::fs::Permissions::from_mode(0o000)).unwrap();
            }),
        ),
    ];
    for (what, corrupt) in &corruptions {
        std::fs::write(index_file(&store), &good).ok();
        assert_index_used(&store, &format!("{what}: before"));
        corrupt();
        lists_as_without_index(&store, what);
        assert_index_used(&store, &format!("{what}: after"));
    }
}

#[test]
fn an_index_that_is_a_directory_or_cannot_be_written_changes_no_listing() {
    let (_dir, store) = index_corpus();
    std::fs::create_dir(index_file(&store)).unwrap();
    std::fs::write(index_file(&store).join("stray"), "x").unwrap();
    for _ in 0..2 {
        let io = lists_as_without_index(&store, "a directory");
        assert!(io.whole_reads >= 8, "no index is read: {io:?}");
    }
    assert!(index_file(&store).is_dir(), "kin does not remove what it did not write");
    std::fs::remove_dir_all(index_file(&store)).unwrap();
    lists_as_without_index(&store, "the directory removed");
    assert_index_used(&store, "written again");
}

fn memo_file(store: &SessionStore) -> PathBuf {
    kin::testkit::session::dir_memo::path(store.root()).unwrap()
}

/// An indexed query that memoizes every listing of a project directory, however recent (a
/// test's directories are a moment old; `dir_memo::SETTLE` is two seconds).
fn memoizing(store: &SessionStore) -> SessionQuery<StoreSource> {
    SessionQuery::new(StoreSource::persisted_only(store.clone()).with_index().with_dir_settle(Duration::ZERO))
}

/// The project directories of the store.
fn project_dirs(store: &SessionStore) -> u64 {
    std::fs::read_dir(store.root()).unwrap().count() as u64
}

/// A fresh memoizing query lists what no index lists without listing a project directory: the
/// memo on disk is sound and current.
fn assert_memo_used(store: &SessionStore, what: &str) {
    let io = lists_as_unindexed(store, memoizing(store), what);
    assert_eq!(io.dir_listings, 0, "{what}: {io:?}");
}

/// Issue 23: a kin just started stats every log but lists no project directory that has not
/// changed since a scan listed it, cold or warm; a directory memoized before holds under the
/// default margin too; and without the index no directory is memoized.
#[test]
fn a_cold_listing_lists_no_project_directory_whose_stamp_holds() {
    let (_dir, store) = index_corpus();
    let dirs = project_dirs(&store);
    assert_eq!(dirs, 2);
    // `lists_as_unindexed` scans four times: the list and the tree, cold and warm.
    let first = lists_as_unindexed(&store, memoizing(&store), "no memo yet");
    assert_eq!(first.dir_listings, dirs, "the first scan lists each directory; the others none: {first:?}");
    assert!(memo_file(&store).is_file(), "written with the index");
    let q = memoizing(&store);
    let io = lists_as_unindexed(&store, q, "memoized");
    assert_eq!(io.dir_listings, 0, "{io:?}");
    assert_eq!((io.whole_reads, io.header_reads), (0, 0), "{io:?}");
    assert_eq!(
        io.stats,
        4 * 12,
        "every log is still statted in each scan (the list and the tree, cold and warm): {io:?}"
    );
    let modified = std::fs::metadata(memo_file(&store)).unwrap().modified().unwrap();
    let io = lists_as_without_index(&store, "the default margin");
    assert_eq!(io.dir_listings, 0, "{io:?}");
    assert_eq!(std::fs::metadata(memo_file(&store)).unwrap().modified().unwrap(), modified, "unchanged: not written");
    // A query without the index lists every directory in every scan.
    let plain = query(&store, &[]);
    listing_text(&plain);
    listing_text(&plain);
    assert_eq!(plain.source().io().dir_listings, 4 * dirs);
    // Directories a moment old are not memoized under the default margin.
    std::fs::remove_file(memo_file(&store)).unwrap();
    let (_fresh_dir, fresh) = index_corpus();
    let io = lists_as_without_index(&fresh, "fresh directories");
    assert_eq!(io.dir_listings, 4 * dirs, "{io:?}");
}

/// The memo file's first line (parsed) and its directory lines (parsed).
fn memo_parts(store: &SessionStore) -> (Value, Vec<Value>) {
    let text = std::fs::read_to_string(memo_file(store)).unwrap();
    let mut lines = text.lines();
    let head = serde_json::from_str(lines.next().unwrap()).unwrap();
    (head, lines.map(|line| serde_json::from_str(line).unwrap()).collect())
}

/// Writes a memo of these directory lines with a first line that matches them (count, digest).
fn write_memo(store: &SessionStore, head: &Value, dirs: &[Value]) {
    let body: String = dirs.iter().map(|line| format!("{line}\n")).collect();
    let mut head = head.clone();
    head["dirs"] = json!(dirs.len());
    head["digest"] = json!(format!("{:032x}", xxhash_rust::xxh3::xxh3_128(body.as_bytes())));
    std::fs::write(memo_file(store), format!("{head}\n{body}")).unwrap();
}

/// Issue 23: a memo that is missing, damaged in any way, or whose stamp no longer matches its
/// directory lists exactly what no memo lists, and is written again.
#[test]
fn every_damaged_or_stale_memo_lists_as_without_one_and_is_rewritten() {
    let (_dir, store) = index_corpus();
    lists_as_unindexed(&store, memoizing(&store), "building it");
    // The directory of P's family, and an edit of its line.
    let family_dir =
        |dirs: &[Value]| dirs.iter().position(|d| d["sessions"].as_str().unwrap().split('/').any(|s| s == P)).unwrap();
    let edit = |f: &dyn Fn(&mut Value)| {
        let store = store.clone();
        let f: &dyn Fn(&mut Value) = f;
        let (head, mut dirs) = memo_parts(&store);
        let at = family_dir(&dirs);
        f(&mut dirs[at]);
        write_memo(&store, &head, &dirs);
    };
    // The names are one string, joined by `/`.
    let without_a = |d: &mut Value| {
        let names: Vec<&str> = d["sessions"].as_str().unwrap().split('/').filter(|s| *s != A).collect();
        d["sessions"] = json!(names.join("/"));
    };
    let older = |d: &mut Value| {
        let seconds = d["stamp"]["ctime"][0].as_i64().unwrap();
        d["stamp"]["ctime"][0] = json!(seconds - 10);
    };
    let text = || std::fs::read_to_string(memo_file(&store)).unwrap();
    let damaged: Vec<Corruption<'_>> = vec![
        ("missing", Box::new(|| std::fs::remove_file(memo_file(&store)).unwrap())),
        ("empty", Box::new(|| std::fs::write(memo_file(&store), "").unwrap())),
        ("garbage", Box::new(|| std::fs::write(memo_file(&store), [7u8, 0, 255, 10].repeat(500)).unwrap())),
        ("truncated", Box::new(|| std::fs::write(memo_file(&store), &text()[..text().len() / 2]).unwrap())),
        (
            "another version",
            Box::new(|| {
                std::fs::write(memo_file(&store), text().replacen("\"kinCatalogDirs\":1", "\"kinCatalogDirs\":9", 1))
                    .unwrap()
            }),
        ),
        (
            "a name changed under its digest",
            Box::new(|| std::fs::write(memo_file(&store), text().replacen(B, "child-x", 1)).unwrap()),
        ),
        ("a directory's line unreadable", Box::new(|| edit(&|d| d["stamp"] = json!("now")))),
        (
            "another directory's stamp, a session left out",
            Box::new(|| {
                let (_, dirs) = memo_parts(&store);
                let other = dirs[1 - family_dir(&dirs)]["stamp"].clone();
                edit(&|d| {
                    without_a(d);
                    d["stamp"] = other.clone();
                })
            }),
        ),
        // As if written before a change: the directory's ctime since is later than the memo's.
        (
            "an older ctime, a session left out",
            Box::new(|| {
                edit(&|d| {
                    without_a(d);
                    older(d);
                })
            }),
        ),
        (
            "a session that is not there",
            Box::new(|| edit(&|d| d["sessions"] = json!(format!("{}/child-ghost", d["sessions"].as_str().unwrap())))),
        ),
        (
            "a directory in its place",
            Box::new(|| {
                std::fs::remove_file(memo_file(&store)).unwrap();
                std::fs::create_dir(memo_file(&store)).unwrap();
            }),
        ),
    ];
    for (what, damage) in &damaged {
        assert_memo_used(&store, &format!("{what}: before"));
        damage();
        lists_as_unindexed(&store, memoizing(&store), what);
        if memo_file(&store).is_dir() {
            std::fs::remove_dir(memo_file(&store)).unwrap();
            lists_as_unindexed(&store, memoizing(&store), what);
        }
        assert_memo_used(&store, &format!("{what}: after"));
    }
    // A new child in P's directory after the memo was made (its recorded ctime older than the
    // directory's now): found by the next kin.
    edit(&older);
    continuable_child(&store, "child-new", P, 20, "new");
    let io = lists_as_unindexed(&store, memoizing(&store), "a child made since");
    assert!(unindexed(&store).contains("child-new"));
    assert_eq!(io.dir_listings, 1, "only P's directory is listed again: {io:?}");
}

#[test]
fn a_stale_entry_is_never_used_for_a_log_that_changed() {
    let (_dir, store) = index_corpus();
    lists_as_without_index(&store, "building it");
    // Grew: a second descriptor appended to A (corrupt now).
    let mut a = store.load(A).unwrap();
    a.append(DESCRIPTOR_EVENT, continuable("again").to_value());
    a.flush().unwrap();
    drop(a);
    lists_as_without_index(&store, "a log that grew");
    assert_index_used(&store, "a log that grew");
    // Shrank: B rewritten as its header and a descriptor with another label.
    let b = log_path(&store, B);
    let text = std::fs::read_to_string(&b).unwrap();
    let shorter =
        format!("{}\n{}\n", text.lines().next().unwrap(), ev(0, DESCRIPTOR_EVENT, continuable("short").to_value()));
    assert!(shorter.len() < text.len());
    std::fs::write(&b, shorter).unwrap();
    assert!(unindexed(&store).contains("short") && !unindexed(&store).contains("label child-b"));
    lists_as_without_index(&store, "a log that shrank");
    assert_index_used(&store, "a log that shrank");
    // Replaced with the same length (a new mtime): C's descriptor becomes version 3.
    let c = log_path(&store, C);
    let original = std::fs::read_to_string(&c).unwrap();
    let future = original.replacen("\"version\":2", "\"version\":3", 1);
    assert_eq!(future.len(), original.len());
    let mtime = std::fs::metadata(&c).unwrap().modified().unwrap();
    std::fs::write(&c, &future).unwrap();
    let later = mtime + Duration::from_secs(5);
    std::fs::File::options().write(true).open(&c).unwrap().set_modified(later).unwrap();
    lists_as_without_index(&store, "replaced with the same length");
    assert_index_used(&store, "replaced with the same length");
    // Replaced with the same length and the same mtime: its ctime moved (no one sets it back), so
    // the log is read whole.
    std::fs::write(&c, &original).unwrap();
    std::fs::File::options().write(true).open(&c).unwrap().set_modified(later).unwrap();
    assert_eq!(std::fs::metadata(&c).unwrap().len(), future.len() as u64);
    let io = lists_as_without_index(&store, "same length, same mtime, another descriptor");
    assert!(io.whole_reads >= 1, "{io:?}");
    assert_index_used(&store, "same length, same mtime, another descriptor");
    // Only its ctime moved (a chmod): read whole again, listed the same.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&c, std::fs::Permissions::from_mode(0o640)).unwrap();
    let io = lists_as_without_index(&store, "a chmod");
    assert_eq!((io.whole_reads, io.header_reads), (1, 1), "only C is read: {io:?}");
    assert_index_used(&store, "a chmod");
    // Gone: D's session directory removed; a log replaced by a directory.
    std::fs::remove_dir_all(log_path(&store, D).parent().unwrap()).unwrap();
    let e = log_path(&store, E);
    std::fs::remove_file(&e).unwrap();
    std::fs::create_dir(&e).unwrap();
    lists_as_without_index(&store, "logs gone");
    assert_index_used(&store, "logs gone");
    // New: a child the index has no entry for.
    continuable_child(&store, "child-new", P, 12, "new");
    assert!(unindexed(&store).contains("child-new"));
    lists_as_without_index(&store, "a new child");
    assert_index_used(&store, "a new child");
    // The whole directory of another project removed.
    std::fs::remove_dir_all(store.root().join(kin::testkit::session::layout::project_key("/elsewhere"))).unwrap();
    lists_as_without_index(&store, "a project gone");
    assert_index_used(&store, "a project gone");
}

/// Each project's entries in the index file, as (project, session) in file order.
fn index_order(store: &SessionStore) -> Vec<(String, String)> {
    let field = |entry: &Value, name: &str| entry[name].as_str().unwrap().to_string();
    let (_, entries) = index_parts(store);
    entries
        .iter()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .map(|entry| (field(&entry, "project"), field(&entry, "session")))
        .collect()
}

/// Issue 23: the index holds each project's logs in the order a scan of the directory finds
/// them, so the next process's first scan takes each entry in step rather than by name; an index
/// in any other order (a directory that changed, a hand-made file) is used all the same.
#[test]
fn the_index_keeps_the_order_a_scan_finds_the_logs_in_and_any_order_is_used() {
    let (_dir, store) = index_corpus();
    lists_as_without_index(&store, "building it");
    let written = index_order(&store);
    let mut projects: Vec<&str> = written.iter().map(|(project, _)| project.as_str()).collect();
    projects.dedup();
    assert_eq!(projects.len(), 2, "each project's entries are one run: {written:?}");
    for project in projects {
        // The directory's own order (the scan's `getdents`), of the session directories with a log.
        let found: Vec<String> = std::fs::read_dir(store.root().join(project))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|session| session.join("session.jsonl").is_file())
            .map(|session| session.file_name().unwrap().to_str().unwrap().to_string())
            .collect();
        let indexed: Vec<String> =
            written.iter().filter(|(p, _)| p == project).map(|(_, session)| session.clone()).collect();
        assert_eq!(indexed, found, "{project}: the index is in the directory's order");
    }
    // Reversed, each project's scan is out of step with the file from its first log on: every
    // entry is still found by name, and nothing is read that the index holds.
    let (head, mut entries) = index_parts(&store);
    entries.reverse();
    write_index_entries(&store, &head, &entries);
    assert_index_used(&store, "an index in reverse order");
    // Unchanged since that listing (which took every entry), the reversed file is not rewritten.
    let reversed: Vec<_> = written.iter().rev().cloned().collect();
    assert_eq!(index_order(&store), reversed);
}

/// Issue 23: kin's own writes keep the index current. A child that a watched store (the
/// runtime's arrangement) publishes, flushes and closes is in the index once the watch settles,
/// so the next process's first listing reads its descriptor line and not its log; a log that
/// grew without the watch (another kin, a hand edit) is still detected by its length and read
/// whole; a child removed loses its entry. Every listing is the one no index gives.
#[test]
fn children_kin_writes_are_listed_cold_from_the_index_without_reading_their_logs() {
    let (_dir, plain) = index_corpus();
    lists_as_without_index(&plain, "building it");
    // The writing process: a query that keeps the index (it never lists here) and a store that
    // reports to it.
    let keeper = StoreSource::persisted_only(plain.clone()).with_index();
    let store = plain.clone().watched(keeper.watch());
    continuable_child(&store, "child-new", P, 12, "new");
    one_shot_child(&store, "child-one", P, 13, Some("one"));
    let mut a = store.load(A).unwrap();
    a.append(DESCRIPTOR_EVENT, continuable("again").to_value());
    a.flush().unwrap();
    drop(a);
    keeper.settle();
    let listed = unindexed(&plain);
    assert!(listed.contains("child-new") && listed.contains("child-one"), "{listed}");
    assert!(listed.contains(&format!("{A:?}, reason: Corrupt")), "A has two descriptors now: {listed}");
    let io = lists_as_without_index(&plain, "children kin wrote");
    assert_eq!((io.whole_reads, io.header_reads), (0, 0), "every log kin wrote is in the index: {io:?}");
    // Every candidate is summarised from the index, the fork (which has no descriptor) included.
    assert!(io.index_summaries >= 9, "{io:?}");
    // A write kin's watch does not see: detected by the length, read whole, listed the same.
    let mut b = plain.load(B).unwrap();
    b.append(DESCRIPTOR_EVENT, continuable("unwatched").to_value());
    b.flush().unwrap();
    drop(b);
    let io = lists_as_without_index(&plain, "a log that grew unwatched");
    assert_eq!((io.whole_reads, io.header_reads), (1, 1), "only B is read: {io:?}");
    // A child removed through the watched store: its entry goes with it.
    let index_text = || std::fs::read_to_string(index_file(&plain)).unwrap();
    assert!(index_text().contains("child-one"));
    store.discard_unaccepted("child-one").unwrap();
    keeper.settle();
    assert!(!index_text().contains("child-one"), "the removed child's entry is gone");
    assert!(!unindexed(&plain).contains("child-one"));
    assert_index_used(&plain, "a child removed");
}

/// The same through the runtime: a continuable child it starts and settles is listed by the
/// next process's first listing from the index, without its log being read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_the_runtime_writes_is_in_the_index_after_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::new([]).route("first", [ReplayEntry::Chunks(text_response(&["one"]))]);
    let (rt, _) = runtime_with(dir.path(), model, "");
    let store = rt.store().clone();
    let (parent_id, caller) = parent(&rt, dir.path());
    let (child, _) = rt.continuation().start("spawn", "worker".into(), start_request(&caller, "first")).await.unwrap();
    until("the child to settle", || !rt.continuation().is_resident(&child)).await;
    rt.shutdown().await;
    drop(caller);
    // The runtime's query goes with it, and settles its watch first.
    drop(rt);
    let expected = listing_text_of(&query(&store, &[]), &parent_id);
    assert!(expected.contains(&child), "{expected}");
    let cold = indexed(&store);
    assert_eq!(listing_text_of(&cold, &parent_id), expected);
    let io = cold.source().io();
    assert_eq!((io.whole_reads, io.header_reads, io.index_summaries), (0, 0, 1), "{io:?}");
}

/// `listing_text` below another parent.
fn listing_text_of(q: &dyn QueryService, parent: &str) -> String {
    let entries = list(q, parent);
    let rendered = entries.as_ref().map(|e| render(e)).unwrap_or_default();
    format!("{entries:?}\n{rendered}")
}
